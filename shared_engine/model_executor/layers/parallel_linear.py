"""Tensor-parallel linear layers (Megatron-LM's split, Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053).

`ColumnParallelLinear` keeps a slice of the output features (rows of the `[out, in]` weight) and needs
no communication; `RowParallelLinear` keeps the matching slice of the input features (columns) and sums
its partial outputs over the ranks with one all-reduce. A column layer followed by a row layer (q/k/v →
attention → o_proj; gate/up → SiLU·mul → down) therefore costs one all-reduce per block. Both subclass
`nn.Linear` (parameters `weight`, `bias`) with the local shapes, so at TP=1 they are plain linears.

Fused layers (`qkv_proj`, `gate_up_proj`) hold several checkpoint tensors ("shards": q, k, v or gate, up)
one after another; each rank keeps its own rows of every shard, in the same order. `load_shard` copies a
checkpoint tensor's slice for this rank into place. With `quantization="fp8"` both run their matmul in FP8
(layers/fp8_linear.py) once the loaded weights have been quantised.
"""

from __future__ import annotations

import torch
from torch import nn

from shared_engine.distributed.parallel_state import get_tp_rank, get_tp_world_size, tp_all_reduce
from shared_engine.distributed.partition import HeadPartition, split_range
from shared_engine.model_executor.layers.fp8_linear import apply_linear


class ColumnParallelLinear(nn.Linear):
    """`x [tokens, in_features]` → `[tokens, local out]`. Checkpoint shard s has `shard_sizes[s]` rows (out
    features), of which this rank keeps `shard_rows[s]` = [start, end); the local output is those runs
    concatenated in shard order."""

    def __init__(self, in_features: int, shard_sizes: list[int], shard_rows: list[tuple[int, int]],
                 bias: bool = False) -> None:
        self.shard_sizes, self.shard_rows = list(shard_sizes), list(shard_rows)
        super().__init__(in_features, sum(end - start for start, end in self.shard_rows), bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_linear(self, x)

    @torch.no_grad()
    def load_shard(self, param_name: str, tensor: torch.Tensor, shard: int | None) -> None:
        """Copy this rank's rows of checkpoint tensor `shard` (None: the layer is one tensor) into `param_name`
        ("weight" or "bias"). Raises `ValueError` when the checkpoint tensor cannot hold those rows."""
        index = 0 if shard is None else shard
        start, end = self.shard_rows[index]
        offset = sum(e - s for s, e in self.shard_rows[:index])
        param = getattr(self, param_name)
        if tensor.shape[0] != self.shard_sizes[index] or tensor.shape[1:] != param.shape[1:]:
            raise ValueError(f"checkpoint shape {tuple(tensor.shape)} != ({self.shard_sizes[index]}, "
                             f"{', '.join(map(str, param.shape[1:]))}) (this rank keeps rows [{start}, {end}))")
        param[offset : offset + end - start].copy_(tensor[start:end])


class RowParallelLinear(nn.Linear):
    """`x [tokens, local in]` → `[tokens, out_features]`, summed over the ranks (one all-reduce). This
    rank keeps input features [start, end) of the checkpoint's `[out, in]` weight; a bias is added once,
    after the sum."""

    def __init__(self, full_in_features: int, in_range: tuple[int, int], out_features: int,
                 bias: bool = False) -> None:
        self.full_in_features, self.in_range = full_in_features, in_range
        super().__init__(in_range[1] - in_range[0], out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = tp_all_reduce(apply_linear(self, x, with_bias=False))
        return out if self.bias is None else out + self.bias

    @torch.no_grad()
    def load_shard(self, param_name: str, tensor: torch.Tensor, shard: int | None) -> None:
        param = getattr(self, param_name)
        if param_name == "bias":
            src = tensor
        else:
            start, end = self.in_range
            if tensor.shape != (param.shape[0], self.full_in_features):
                raise ValueError(f"checkpoint shape {tuple(tensor.shape)} != ({param.shape[0]}, "
                                 f"{self.full_in_features}) (this rank keeps columns [{start}, {end}))")
            src = tensor[:, start:end]
        if src.shape != param.shape:
            raise ValueError(f"checkpoint shape {tuple(src.shape)} != parameter {tuple(param.shape)}")
        param.copy_(src)


def qkv_parallel_linear(hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, part: HeadPartition,
                        bias: bool) -> ColumnParallelLinear:
    """q, k, v fused: this rank's query heads of q_proj and KV heads of k_proj and v_proj."""
    q = (part.q_start * head_dim, part.q_end * head_dim)
    kv = (part.kv_start * head_dim, part.kv_end * head_dim)
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    return ColumnParallelLinear(hidden_size, sizes, [q, kv, kv], bias=bias)


def o_parallel_linear(num_heads: int, head_dim: int, part: HeadPartition, hidden_size: int) -> RowParallelLinear:
    """o_proj: the input features of this rank's query heads."""
    return RowParallelLinear(num_heads * head_dim, (part.q_start * head_dim, part.q_end * head_dim), hidden_size)


def gate_up_parallel_linear(hidden_size: int, intermediate_size: int) -> ColumnParallelLinear:
    """gate and up fused: the same run of intermediate features of each."""
    cols = split_range(intermediate_size, get_tp_world_size(), get_tp_rank())
    return ColumnParallelLinear(hidden_size, [intermediate_size] * 2, [cols, cols])


def down_parallel_linear(intermediate_size: int, hidden_size: int) -> RowParallelLinear:
    cols = split_range(intermediate_size, get_tp_world_size(), get_tp_rank())
    return RowParallelLinear(intermediate_size, cols, hidden_size)


def local_head_partition(num_heads: int, num_kv_heads: int) -> HeadPartition:
    """This process's heads (all of them at TP=1)."""
    from shared_engine.distributed.partition import head_partition

    return head_partition(num_heads, num_kv_heads, get_tp_world_size(), get_tp_rank())
