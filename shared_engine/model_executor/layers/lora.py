"""Per-token LoRA for a mixed-adapter batch: each token adds the delta of its own adapter's GPU slot.

A model with LoRA enabled holds, per targeted projection, `max_loras` slots of rank `max_lora_rank`
(smaller ranks are zero-padded: the padding adds exact zeros). For a token `x` [in] in slot `s`,

    y = W x + B_s (A_s x)          (A_s [R, in], B_s [out, R], the adapter's scaling folded into B_s)

computed for the whole batch as two dense matmuls over all slots, masked per token:

    shrink = x @ A_all^T                         [T, S * R]     (A_all = the slots' A stacked)
    shrink *= onehot(slot of each token)         (zero outside the token's slot; slot -1, the base: all zero)
    y += shrink @ B_all                          [T, out]       (B_all [S * R, out])

Every shape is static, with no host sync and no data-dependent control flow, so the same code runs on the
CPU and inside CUDA graphs (the slot map lives in `LoRAContext`'s fixed buffers, refilled before each
step). The cost is that of all `max_loras` slots whichever adapters the step uses (Punica's BGMV/SGMV
kernels, Chen et al. 2023, https://arxiv.org/abs/2310.18547, read only the used ones). On CUDA the layers
use those kernels instead (kernels/lora_bgmv.py: per-token shrink/expand reading each token's own slot,
mixed ranks via each layer's `slot_ranks`, 0 for a module the slot's adapter does not target), with the
same fixed buffers, so they are captured in CUDA graphs.
"""

from __future__ import annotations

import torch
from torch import nn


class LoRAContext:
    """The step's token → slot map, shared by every LoRA layer of one model.

    `slot_mask` [max_num_tokens, max_loras] (model dtype): row t is one-hot at token t's slot, all zero for
    the base model (slot -1) and for padding rows. `active`: False skips every LoRA layer in eager steps
    whose tokens all run on the base model (bitwise the base model's output); CUDA graphs are captured
    with it True.
    """

    def __init__(self, max_num_tokens: int, max_loras: int, dtype: torch.dtype, device: torch.device) -> None:
        self.max_loras = max_loras
        self.slot_mask = torch.zeros(max_num_tokens, max_loras, dtype=dtype, device=device)
        self._token_slots = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=device)
        self._slot_ids = torch.arange(max_loras, device=device)
        self.use_kernels = torch.device(device).type == "cuda"
        self.active = False

    @property
    def token_slots(self) -> torch.Tensor:
        """[max_num_tokens] int64: each token's slot (-1: base model and padding)."""
        return self._token_slots

    def set_token_slots(self, token_slots: torch.Tensor) -> None:
        """`token_slots` [num_tokens] int64 (slot of each token, -1 = base) → the fixed mask buffer."""
        n = token_slots.shape[0]
        if n > self._token_slots.shape[0]:
            raise ValueError(f"{n} tokens exceed the LoRA context's {self._token_slots.shape[0]}")
        self._token_slots.fill_(-1)
        self._token_slots[:n].copy_(token_slots, non_blocking=True)
        self.slot_mask.copy_(self._token_slots[:, None] == self._slot_ids[None, :])


class LoRAProjection(nn.Module):
    """The LoRA slots of one (possibly fused) projection: output slices `out_sizes` (q, k, v of a fused
    qkv_proj, or gate, up), one A and B stack per slice.

    Buffers: `lora_a` [num_slices * max_loras * max_rank, in_features] (slice-major, then slot, then rank
    row); `lora_b_<i>` [max_loras * max_rank, out_sizes[i]] (B transposed, scaled).
    """

    def __init__(self, ctx: LoRAContext, in_features: int, out_sizes: list[int], max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.ctx = ctx
        self.out_sizes = list(out_sizes)
        self.max_rank = max_rank
        width = ctx.max_loras * max_rank
        self.register_buffer("lora_a", torch.zeros(len(out_sizes) * width, in_features, dtype=dtype, device=device))
        for i, size in enumerate(out_sizes):
            self.register_buffer(f"lora_b_{i}", torch.zeros(width, size, dtype=dtype, device=device))
        # [num_slices, max_loras] int32: each slot's rank in each slice, 0 where its adapter does not target
        # the module (the kernels then skip it)
        self.register_buffer("slot_ranks", torch.zeros(len(out_sizes), ctx.max_loras, dtype=torch.int32,
                                                       device=device))

    def lora_b(self, index: int) -> torch.Tensor:
        return getattr(self, f"lora_b_{index}")

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Add each token's delta to `out` [num_tokens, sum(out_sizes)] in place; `x` [num_tokens, in]."""
        if not self.ctx.active:
            return out
        num_tokens = x.shape[0]
        slots, rank = self.ctx.max_loras, self.max_rank
        if self.ctx.use_kernels:
            return self._forward_kernels(x, out)
        shrink = (x @ self.lora_a.t()).view(num_tokens, len(self.out_sizes), slots, rank)
        shrink = shrink * self.ctx.slot_mask[:num_tokens, None, :, None]
        offset = 0
        for i, size in enumerate(self.out_sizes):
            out[:, offset : offset + size] += shrink[:, i].reshape(num_tokens, slots * rank) @ self.lora_b(i)
            offset += size
        return out

    def _forward_kernels(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        from kernels.lora_bgmv import lora_expand, lora_shrink

        slots, rank, ctx = self.ctx.max_loras, self.max_rank, self.ctx
        a = self.lora_a.view(len(self.out_sizes), slots, rank, -1)
        offset = 0
        for i, size in enumerate(self.out_sizes):
            ranks = self.slot_ranks[i]
            shrunk = lora_shrink(x, a[i], ctx.token_slots, ranks)  # [num_tokens, rank] fp32
            lora_expand(out[:, offset : offset + size], shrunk, self.lora_b(i).view(slots, rank, size),
                        ctx.token_slots, ranks)
            offset += size
        return out

    @torch.no_grad()
    def write_slot(self, slot: int, slice_index: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Put one adapter's `a` [r, in] and `b` [out, r] (scaled) into `slot` for slice `slice_index`; None
        (the adapter does not target it) zeroes the slot's rows."""
        width = self.ctx.max_loras * self.max_rank
        rows = slice(slice_index * width + slot * self.max_rank, slice_index * width + (slot + 1) * self.max_rank)
        b_rows = slice(slot * self.max_rank, (slot + 1) * self.max_rank)
        self.lora_a[rows].zero_()
        self.lora_b(slice_index)[b_rows].zero_()
        self.slot_ranks[slice_index, slot] = 0 if a is None else a.shape[0]
        if a is None:
            return
        r = a.shape[0]
        self.lora_a[rows][:r].copy_(a, non_blocking=True)
        self.lora_b(slice_index)[b_rows][:r].copy_(b.t(), non_blocking=True)
