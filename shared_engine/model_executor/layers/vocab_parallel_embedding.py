"""Vocabulary-parallel embedding and LM head (Megatron-LM's split).

The vocabulary, padded to a multiple of the TP size (`padded_vocab_size`), is cut into equal runs; rank r
holds rows [r * V_local, (r + 1) * V_local) of the embedding and of the LM head (the same tensor when
they are tied). The embedding looks up the ids in its run, zeroes the others and sums over the ranks
(one all-reduce per step); the LM head computes its run of logits and all-gathers them, then drops the
padding columns. Both subclass their torch modules with the local shapes: at TP=1 they are plain ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared_engine.distributed.parallel_state import get_tp_rank, get_tp_world_size, tp_all_gather, tp_all_reduce
from shared_engine.distributed.partition import padded_vocab_size


def _vocab_range(vocab_size: int) -> tuple[int, int]:
    local = padded_vocab_size(vocab_size, get_tp_world_size()) // get_tp_world_size()
    return get_tp_rank() * local, (get_tp_rank() + 1) * local


@torch.no_grad()
def _load_rows(param: torch.Tensor, tensor: torch.Tensor, start: int, vocab_size: int) -> None:
    if tensor.shape != (vocab_size, param.shape[1]):
        raise ValueError(f"checkpoint shape {tuple(tensor.shape)} != ({vocab_size}, {param.shape[1]})")
    rows = tensor[start : start + param.shape[0]]
    param[: rows.shape[0]].copy_(rows)
    param[rows.shape[0] :].zero_()  # padding rows of the last rank


class VocabParallelEmbedding(nn.Embedding):
    """`input_ids [tokens]` int64 → `[tokens, hidden]`."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        self.vocab_size = vocab_size
        self.vocab_start, self.vocab_end = _vocab_range(vocab_size)
        super().__init__(self.vocab_end - self.vocab_start, hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if get_tp_world_size() == 1:
            return super().forward(input_ids)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local = (input_ids - self.vocab_start).masked_fill(outside, 0)
        hidden = F.embedding(local, self.weight).masked_fill(outside[:, None], 0.0)
        return tp_all_reduce(hidden)

    def load_shard(self, param_name: str, tensor: torch.Tensor, shard: int | None) -> None:
        _load_rows(self.weight, tensor, self.vocab_start, self.vocab_size)


class ParallelLMHead(nn.Linear):
    """`hidden [rows, hidden]` → logits `[rows, vocab_size]` (all-gathered over the ranks)."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.vocab_start, vocab_end = _vocab_range(vocab_size)
        super().__init__(hidden_size, vocab_end - self.vocab_start, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)  # [rows, V_local]
        if get_tp_world_size() == 1:
            return logits
        logits = tp_all_gather(logits)  # [rows, padded vocab]
        return logits if logits.shape[1] == self.vocab_size else logits[:, : self.vocab_size].contiguous()

    def load_shard(self, param_name: str, tensor: torch.Tensor, shard: int | None) -> None:
        _load_rows(self.weight, tensor, self.vocab_start, self.vocab_size)
