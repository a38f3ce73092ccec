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
step). The cost is that of all `max_loras` slots whichever adapters the step uses. On CUDA the layers run
Triton kernels instead, on the same fixed buffers (so CUDA graphs capture them), with mixed ranks via each
layer's `slot_ranks` (0 for a module the slot's adapter does not target):
- `sgmv` (default, kernels/lora_sgmv.py): the host groups the step's tokens by slot into tiles of up to 16
  tokens (64 in large eager steps); each tile reads its adapter's A and B once, and one launch covers every
  slice of a fused projection (q, k, v; gate, up); steps of at most FUSED_MAX_TOKENS tokens (batch-1
  decodes) run shrink and expand as one launch (`sgmv_fused`), steps of at most TINY_MAX_TOKENS tokens
  (kernels/lora_tiny.py, LORA_TINY_MAX_TOKENS, default 8: the served path of batch-1 decodes) without tiles
  (each program reads its token's slot; split-K shrinks, then the expands, two launches by default);
- `bgmv` (`lora_kernel="bgmv"`, kernels/lora_bgmv.py): each token reads its own slot's A and B.
Inside CUDA graph captures the model calls `LoRAProjection.apply(x, base_gemm)`, which forks each SGMV shrink
onto a side stream beside the base GEMM (both read only `x`) and joins before the expand (LORA_OVERLAP=0: no
fork): at batch 1 on the H200 the 64 shrinks of a q/k/v/o adapter were 0.24 ms of a 5.24 ms step
(benchmarks/results/profile_lora_step_h200_c518670.json: 64 shrinks of ~3.8 us).

Each projection belongs to a group (`qkv`, `o`, `gate_up`, `down`): a step runs the LoRA of only the groups
that an adapter among its slots targets (`LoRAContext.groups`, set by the LoRA manager). Eagerly the other
groups launch nothing; CUDA graphs are captured per `variant` (`LORA_ALL`: every group; `LORA_ATTENTION`:
q/k/v and o only, the decode graphs' second LoRA variant), so a step whose adapters target only attention
projections (bench_lora's q/k/v/o adapters, PEFT's default q/v) replays a graph without the MLP's four
launches per layer. Skipping a group is exact: none of the step's slots holds a row for it (rank 0).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

# graph variants (the fourth element of a CUDA graph key; LORA_ALL == True, so keys built with True mean all)
LORA_NONE, LORA_ALL, LORA_ATTENTION = 0, 1, 2
ATTENTION_GROUPS = frozenset({"qkv", "o"})
# eager steps of at least this many token rows take 64-token SGMV tiles; 0 (the default) never: on the H200 at
# 8ea6fb5 (1024 then) 30 rank-16 adapters gave 9,459 output tok/s against 10,307 with 16-token tiles everywhere
# at c518670 (benchmarks/results/lora_h200_llama8b_8ea6fb5.json, ..._c518670.json). LORA_PREFILL_TILE_ROWS
# sets it for A/B runs on a GPU.
PREFILL_TILE_ROWS = int(os.environ.get("LORA_PREFILL_TILE_ROWS", "0"))
# inside CUDA graph captures, each projection's SGMV shrink runs on a side stream beside the base GEMM
# (`LoRAProjection.apply`); LORA_OVERLAP=0 keeps it on the compute stream after the GEMM (A/B runs on a GPU)
OVERLAP = os.environ.get("LORA_OVERLAP", "1") != "0"


def step_tile_m(num_tokens: int, graphed: bool) -> int:
    """The SGMV tile (tokens) for a step: `TILE_M` (16) in CUDA graphs, which were captured with it, and in
    small eager steps (decodes: a few tokens per adapter); `PREFILL_TILE_M` (64) in eager steps of at least
    PREFILL_TILE_ROWS rows when that is set, not by default (prefill chunks: long runs of one adapter's
    tokens, so each tile reads its adapter's A and B for 64 tokens and a quarter of the programs launch)."""
    from kernels.lora_sgmv import PREFILL_TILE_M, TILE_M

    if graphed or not PREFILL_TILE_ROWS or num_tokens < PREFILL_TILE_ROWS:
        return TILE_M
    return PREFILL_TILE_M


class LoRAContext:
    """The step's token → slot map, shared by every LoRA layer of one model, in fixed device buffers.

    One int32 buffer holds, for `max_num_tokens` token rows (the step's rows in the layout the model runs,
    a CUDA graph's padded one included): `token_slots` (each row's slot, -1 for the base model and padding),
    and the SGMV metadata `sgmv_tokens` / `sgmv_tiles` (kernels/lora_sgmv.build_tiles); `slot_mask`
    [max_num_tokens, max_loras] (model dtype, the torch path): row t one-hot at token t's slot, all zero for
    slot -1. `active`: False skips every LoRA layer in eager steps whose tokens all run on the base model
    (bitwise the base model's output) and picks a CUDA graph captured without the LoRA layers where there
    is one (`CudaGraphRunner`); graphs with the layers are captured with it True. `groups`: the projection
    groups whose LoRA runs (None: all), the union of what the step's adapters target. `kernel`: "torch" (the
    masked dense path; always on the CPU), "sgmv" or "bgmv" (CUDA, `LoRAConfig.lora_kernel`).
    """

    def __init__(self, max_num_tokens: int, max_loras: int, dtype: torch.dtype, device: torch.device,
                 kernel: str = "sgmv") -> None:
        from kernels.lora_sgmv import max_tiles

        self.max_loras = max_loras
        self.max_num_tokens = max_num_tokens
        self.kernel = kernel if torch.device(device).type == "cuda" else "torch"
        self.max_tiles = max(1, max_tiles(max_num_tokens, max_loras))
        n, tiles = max_num_tokens, self.max_tiles
        self._meta = torch.zeros(2 * n + 3 * tiles, dtype=torch.int32, device=device)
        self._meta[:n].fill_(-1)
        self._meta[2 * n : 2 * n + tiles].fill_(-1)
        self._token_slots = self._meta[:n]
        self.sgmv_tokens = self._meta[n : 2 * n]
        self.sgmv_tiles = self._meta[2 * n :].view(3, tiles)
        self.slot_mask = torch.zeros(max_num_tokens, max_loras, dtype=dtype, device=device)
        self._slot_ids = torch.arange(max_loras, device=device)
        self._all_base = True  # the buffers hold no adapter token (the next all-base step copies nothing)
        self._pin = torch.device(device).type == "cuda"
        self.active = False
        self.groups: frozenset[str] | None = None
        self.tile_m = 16  # the SGMV tiles' token count in the buffers (set_token_slots)
        # the shrinks' side stream (`overlap_stream`); created here, never during a capture
        self._side = torch.cuda.Stream(device=device) if OVERLAP and self.kernel == "sgmv" else None
        # kernels/lora_tiny.py's counters (zero between launches; every layer's launches are in stream order)
        self.tiny_sync = torch.zeros(4, dtype=torch.int32, device=device)

    def overlap_stream(self):
        """The side stream for the SGMV shrinks while a CUDA graph is being captured, else None (eager
        steps, the CPU, bgmv, LORA_OVERLAP=0: the shrink runs on the compute stream, after the GEMM)."""
        if self._side is None or not torch.cuda.is_current_stream_capturing():
            return None
        return self._side

    def runs(self, group: str) -> bool:
        """Whether a projection of `group` adds its LoRA in this step (or the graph being captured)."""
        return self.active and (self.groups is None or group in self.groups)

    def variant(self) -> int:
        """The CUDA graph variant this step needs: LORA_NONE (no adapter token), LORA_ATTENTION (its
        adapters target only q/k/v/o) or LORA_ALL."""
        if not self.active:
            return LORA_NONE
        return LORA_ATTENTION if self.groups is not None and self.groups <= ATTENTION_GROUPS else LORA_ALL

    def use_variant(self, variant: int) -> None:
        """Set `active` and `groups` as graph `variant` runs them (for its capture)."""
        self.active = bool(variant)
        self.groups = ATTENTION_GROUPS if variant == LORA_ATTENTION else None

    @property
    def token_slots(self) -> torch.Tensor:
        """[max_num_tokens] int32: each token row's slot (-1: base model and padding)."""
        return self._token_slots

    def _staging(self) -> torch.Tensor:
        """A host buffer for one step's metadata ([len(meta)] int32), pinned on CUDA. A new one per step:
        PyTorch's pinned-memory allocator hands a block out again only after the copies that read it have
        finished, so a step's metadata is never overwritten while its copy is in flight. Pinned, the copy
        is asynchronous; from pageable memory, 74 KB at llama-3.1-8b's defaults (over the 64 KB that CUDA
        buffers), the driver may wait for the stream, i.e. for the step in flight (not profiled)."""
        return torch.empty(self._meta.shape[0], dtype=torch.int32, pin_memory=self._pin)

    def set_token_slots(self, token_slots, tile_m: int | None = None) -> None:
        """`token_slots` [num_rows] int (numpy or a CPU tensor: each row's slot, -1 = base) → the fixed
        buffers, in one asynchronous host-to-device copy from pinned memory on CUDA (queued on the stream,
        after the step in flight). `tile_m`: the SGMV tiles' token count (kernels/lora_sgmv.py; None:
        `TILE_M`, which CUDA graphs are captured with; an eager step may take `PREFILL_TILE_M`). Raises
        ValueError past `max_num_tokens` rows."""
        from kernels.lora_sgmv import TILE_M, build_tiles

        tile_m = tile_m or TILE_M

        if isinstance(token_slots, torch.Tensor):
            token_slots = token_slots.cpu().numpy()
        slots = np.asarray(token_slots, dtype=np.int32)
        n, cap = slots.shape[0], self.max_num_tokens
        if n > cap:
            raise ValueError(f"{n} tokens exceed the LoRA context's {cap}")
        all_base = not (slots >= 0).any()
        if all_base and self._all_base:
            return
        self.tile_m = tile_m
        staged = self._staging()
        host = staged.numpy()
        host[:n] = slots
        host[n:cap] = -1
        tokens, tiles = build_tiles(slots, cap, self.max_tiles, tile_m)
        host[cap : 2 * cap] = tokens
        host[2 * cap :] = tiles.ravel()
        self._meta.copy_(staged, non_blocking=True)
        if self.kernel == "torch":
            self.slot_mask.copy_(self._token_slots[:, None] == self._slot_ids[None, :])
        self._all_base = all_base


class LoRAProjection(nn.Module):
    """The LoRA slots of one (possibly fused) projection: output slices `out_sizes` (q, k, v of a fused
    qkv_proj, or gate, up), one A and B stack per slice.

    Buffers: `lora_a` [num_slices * max_loras * max_rank, in_features] (slice-major, then slot, then rank
    row); `lora_b_all` [max_loras * max_rank, sum(out_sizes)] (B transposed and scaled; slice i is columns
    `slice_offsets[i]:slice_offsets[i + 1]`, `lora_b(i)`); `slot_ranks` [num_slices, max_loras] int32.
    """

    def __init__(self, ctx: LoRAContext, in_features: int, out_sizes: list[int], max_rank: int,
                 dtype: torch.dtype, device: torch.device, group: str = "") -> None:
        """`group`: the projection's group ("qkv", "o", "gate_up", "down"; see the module docstring)."""
        super().__init__()
        self.ctx = ctx
        self.group = group
        self.out_sizes = list(out_sizes)
        self.max_rank = max_rank
        width = ctx.max_loras * max_rank
        self.register_buffer("lora_a", torch.zeros(len(out_sizes) * width, in_features, dtype=dtype, device=device))
        self.register_buffer("lora_b_all", torch.zeros(width, sum(out_sizes), dtype=dtype, device=device))
        self._offsets = np.cumsum([0, *out_sizes]).tolist()
        self.register_buffer("slice_offsets", torch.tensor(self._offsets, dtype=torch.int32, device=device))
        # [num_slices, max_loras] int32: each slot's rank in each slice, 0 where its adapter does not target
        # the module (the kernels then skip it)
        self.register_buffer("slot_ranks", torch.zeros(len(out_sizes), ctx.max_loras, dtype=torch.int32,
                                                       device=device))
        # host mirror of slot_ranks: rows past it are zero in A and B (`write_slot` zeroes only what it must)
        self._rows_written = [[0] * ctx.max_loras for _ in out_sizes]
        self._views: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # slot_rows' cache

    def lora_b(self, index: int) -> torch.Tensor:
        """Slice `index`'s B: [max_loras * max_rank, out_sizes[index]] (a column view of `lora_b_all`)."""
        return self.lora_b_all[:, self._offsets[index] : self._offsets[index + 1]]

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Add each token's delta to `out` [num_tokens, sum(out_sizes)] in place; `x` [num_tokens, in]."""
        if not self.ctx.runs(self.group):
            return out
        if self.ctx.kernel == "sgmv":
            return self._forward_sgmv(x, out)
        if self.ctx.kernel == "bgmv":
            return self._forward_bgmv(x, out)
        num_tokens = x.shape[0]
        slots, rank = self.ctx.max_loras, self.max_rank
        shrink = (x @ self.lora_a.t()).view(num_tokens, len(self.out_sizes), slots, rank)
        shrink = shrink * self.ctx.slot_mask[:num_tokens, None, :, None]
        for i in range(len(self.out_sizes)):
            lo, hi = self._offsets[i], self._offsets[i + 1]
            out[:, lo:hi] += shrink[:, i].reshape(num_tokens, slots * rank) @ self.lora_b(i)
        return out

    def apply(self, x: torch.Tensor, base) -> torch.Tensor:
        """`base(x)` [num_tokens, sum(out_sizes)] (the projection's base GEMM, a callable) plus each token's
        delta; `x` [num_tokens, in]. Equal to `forward(x, base(x))`. While a CUDA graph is captured (SGMV),
        the shrink, which reads only `x`, runs on the context's side stream concurrently with the GEMM and
        the expand waits for both: the graph keeps the fork and join as dependencies, so each projection's
        shrink (~4 us at batch 1 on the H200, a latency-bound launch) leaves the batch-1 critical path.
        Buffers: `x` is read on the side stream before the compute stream passes the join, so nothing the
        compute stream frees after the join is still in use; the side stream's partials are read by the
        expand, which the side stream's next shrink is queued after (it waits for the compute stream).
        Steps the one-launch kernels take (`sgmv_fused`, `lora_tiny`) are not forked."""
        if not self.ctx.runs(self.group):
            return base(x)
        side = self.ctx.overlap_stream() if self.ctx.kernel == "sgmv" else None
        if side is None or self._fused(x) or self._tiny(x):
            return self.forward(x, base(x))
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            shrunk = self._shrink(x)
        out = base(x)
        main.wait_stream(side)
        return self._expand(out, shrunk)

    def _fused(self, x: torch.Tensor) -> bool:
        from kernels import lora_sgmv_fused as fused

        return x.shape[0] <= fused.FUSED_MAX_TOKENS and x.shape[1] <= fused.FUSED_MAX_IN_FEATURES

    def _tiny(self, x: torch.Tensor) -> bool:
        from kernels import lora_tiny

        return x.shape[0] <= lora_tiny.TINY_MAX_TOKENS and len(self.out_sizes) <= lora_tiny.MAX_SLICES

    def _shrink(self, x: torch.Tensor) -> torch.Tensor:
        """[splits, slices, T, rank] fp32 split-K partials (summed by the expand as it reads them)."""
        from kernels.lora_sgmv import sgmv_shrink

        ctx = self.ctx
        a = self.lora_a.view(len(self.out_sizes), ctx.max_loras, self.max_rank, -1)
        return sgmv_shrink(x, a, self.slot_ranks, ctx.sgmv_tokens, ctx.sgmv_tiles, reduce=False, tile_m=ctx.tile_m)

    def _expand(self, out: torch.Tensor, shrunk: torch.Tensor) -> torch.Tensor:
        from kernels.lora_sgmv import sgmv_expand

        ctx = self.ctx
        return sgmv_expand(out, shrunk, self.lora_b_all.view(ctx.max_loras, self.max_rank, -1), self.slot_ranks,
                           ctx.sgmv_tokens, ctx.sgmv_tiles, self.slice_offsets, max(self.out_sizes),
                           tile_m=ctx.tile_m)

    def _forward_sgmv(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        from kernels import lora_sgmv_fused as fused

        slots, rank, ctx = self.ctx.max_loras, self.max_rank, self.ctx
        if self._tiny(x):  # one launch, no tiles (kernels/lora_tiny.py; LORA_TINY_MAX_TOKENS)
            from kernels.lora_tiny import lora_tiny

            a = self.lora_a.view(len(self.out_sizes), slots, rank, -1)
            return lora_tiny(out, x, a, self.lora_b_all.view(slots, rank, -1), self.slot_ranks, ctx.token_slots,
                             self.out_sizes, ctx.tiny_sync)
        if self._fused(x):  # one launch
            a = self.lora_a.view(len(self.out_sizes), slots, rank, -1)
            return fused.sgmv_fused(out, x, a, self.lora_b_all.view(slots, rank, -1), self.slot_ranks, ctx.sgmv_tokens,
                              ctx.sgmv_tiles, self.slice_offsets, max(self.out_sizes))
        return self._expand(out, self._shrink(x))

    def _forward_bgmv(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        from kernels.lora_bgmv import lora_expand, lora_shrink

        slots, rank, ctx = self.ctx.max_loras, self.max_rank, self.ctx
        a = self.lora_a.view(len(self.out_sizes), slots, rank, -1)
        for i, size in enumerate(self.out_sizes):
            ranks = self.slot_ranks[i]
            shrunk = lora_shrink(x, a[i], ctx.token_slots, ranks)  # [num_tokens, rank] fp32
            lo = self._offsets[i]
            lora_expand(out[:, lo : lo + size], shrunk, self.lora_b(i).view(slots, rank, size), ctx.token_slots,
                        ranks)
        return out

    @torch.no_grad()
    def write_slot(self, slot: int, slice_index: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Put one adapter's `a` [r, in] and `b` [out, r] (scaled) into `slot` for slice `slice_index`; None
        (the adapter does not target it) leaves the slot's rows zero. Rows the previous adapter wrote past r
        are zeroed and the slot's rank written only when it changes, so reloading a slot with an adapter of
        the same shape is two copies per slice (a q/k/v/o adapter of llama-3.1-8b: 256 device operations
        instead of 928), and an untargeted slice that is already zero costs nothing."""
        r = 0 if a is None else a.shape[0]
        self.prepare_rows(slot, slice_index, r)
        if r:
            dst_a, dst_b = self.slot_rows(slot, slice_index, r)
            dst_a.copy_(a, non_blocking=True)
            dst_b.copy_(b.t(), non_blocking=True)

    @torch.no_grad()
    def prepare_rows(self, slot: int, slice_index: int, r: int) -> None:
        """Before rank-`r` rows go into `slot` (slice `slice_index`): zero the rows a larger previous rank
        left, write the slot's rank if it changes (the copies themselves are the caller's: `slot_rows`)."""
        previous = self._rows_written[slice_index][slot]
        if previous > r:
            width = self.ctx.max_loras * self.max_rank
            base = slice_index * width + slot * self.max_rank
            self.lora_a[base + r : base + previous].zero_()
            self.lora_b(slice_index)[slot * self.max_rank + r : slot * self.max_rank + previous].zero_()
        if previous != r:
            self.slot_ranks[slice_index, slot] = r
        self._rows_written[slice_index][slot] = r

    def slot_rows(self, slot: int, slice_index: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of `slot`'s first `r` rows of slice `slice_index`: A [r, in] (contiguous) and B transposed
        [r, out] (a column block of `lora_b_all`). Cached per (slot, slice, r): a slot load builds no views
        after the first load of that shape."""
        key = (slot, slice_index, r)
        views = self._views.get(key)
        if views is None:
            width = self.ctx.max_loras * self.max_rank
            base = slice_index * width + slot * self.max_rank
            b_base = slot * self.max_rank
            views = self._views[key] = (self.lora_a[base : base + r], self.lora_b(slice_index)[b_base : b_base + r])
        return views
