"""LoRA shrink + expand in ONE launch for steps of a few tokens (batch-1 decodes), without SGMV's tiles.

ON by default for steps of at most 8 tokens, as two launches (`TINY_MAX_TOKENS` 8, `TWO_LAUNCHES`; env
LORA_TINY_MAX_TOKENS=0 turns it off, LORA_TINY_TWO_LAUNCHES=0 selects the one-launch counter mode). Measured
on the H200 at 9a99c62 (llama-3.1-8b dummy, one rank-16 q/k/v/o adapter, batch-1 ITL, one engine process
each, benchmarks/results/lora_itl_*_9a99c62.json): SGMV 5.218 ms (+10.5% over the LoRA engine on the base
model), one launch 5.186 ms (+9.6%), two launches 5.117 ms (+8.25%); in the full bench run with the two
launches (lora_h200_llama8b_9a99c62.json) base 4.726 ms, LoRA 5.116 ms (+8.25%), 30 rank-16 adapters 99.7%
and mixed ranks 94.2% of the base's throughput. Why another kernel: at batch 1 on the H200 the two SGMV
launches per projection (kernels/lora_sgmv.py) cost ~3.8 + 4.7 us each plus the gap between two dependent
launches (benchmarks/results/profile_lora_step_h200_c518670.json), and both are latency-bound chains of
dependent loads (tile -> slot -> rank / start -> token -> x, A). The one-launch `sgmv_fused` was slower
(+15.7% at 8ea6fb5) because each of its programs walked all of in_features alone. Here:

- no tiles: program roles are computed from the program id and each program reads its token's slot
  straight from `token_slots` (one load before the weights', which also do not wait for the rank: a slot's
  rows past its rank are zero in the layers' buffers, so the first `BLOCK_R` rows are read at once, beside
  the rank, and only rank > BLOCK_R adds a dependent step);
- GEMV, not `tl.dot` on 16 padded rows: products summed with `tl.sum` in fp32;
- one grid of two roles: the first `num_shrink` programs are split-K shrinks (token, slice, K chunk: many
  SMs share the A read, ~8 KB each at llama-3.1-8b's qkv), each storing its fp32 partial and then
  incrementing a device counter (release); the other programs are expands (token, column block of a
  slice) that prefetch y, B and the rank, wait until the counter reaches `num_shrink` (acquire), sum the
  partials and add B^T s into y. The last expand to finish resets the counters to zero, so a CUDA graph
  replays the launch as captured.

Deadlock freedom: a waiting expand needs every shrink program to run. With `ticket` (set automatically when
the grid exceeds the GPU's SM count, or LORA_TINY_TICKET=1) roles are handed out in the order programs
start (an atomic ticket), so every shrink role belongs to a program that is already running and never
waits. Without it (one program per SM or fewer) every program is resident at once whatever the dispatch
order. Under TRITON_INTERPRET=1 programs run one by one in id order, shrinks first, so both work.
LORA_TINY_TWO_LAUNCHES=1 (`two_launches`): the same programs as two launches, shrinks then expands, with
stream order in place of the counter (no waiting; a second launch's gap and chain, but no tiles either).
The counters must be zero before a launch and are only ever used by launches on one stream (the layers
run in stream order; `LoRAProjection.apply` does not fork this path onto its side stream).

Math (the references are kernels/lora_sgmv.py's `sgmv_shrink_ref` / `sgmv_expand_ref`):

    y[t, slice i] += B[slot(t), :rank, slice i]^T (A[i, slot(t), :rank] @ x[t])    fp32, rounded once to y

tokens of slot -1 (base model, padding) untouched; rank 0 (an untargeted slice) adds nothing.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_same_device, check_tensor

# steps of at most this many tokens take `lora_tiny` in the model's LoRA layer (0: never; LORA_TINY_MAX_TOKENS
# sets it for A/B runs on a GPU)
TINY_MAX_TOKENS = int(os.environ.get("LORA_TINY_MAX_TOKENS", "8"))
# "1": always hand roles out by atomic ticket; "0": never; unset: when the grid exceeds the SM count
_TICKET_ENV = os.environ.get("LORA_TINY_TICKET")
# "1": two launches (the shrink programs, then the expand programs: stream order instead of the counter)
TWO_LAUNCHES = os.environ.get("LORA_TINY_TWO_LAUNCHES", "1") == "1"  # faster at 9a99c62 (docstring)
MAX_SLICES = 3  # q, k, v
_BLOCK_R = 16  # rank rows per step (the first step is read without waiting for the rank)
_BLOCK_N = 128  # output columns per expand program
# shrink programs to aim for (split-K): 64 per token, at most 256 (T = 1 at llama-3.1-8b's qkv: 48 of 256
# K columns, i.e. 8 KB of A each; T = 8: 192 of 512)
_SHRINKS_PER_TOKEN, _MAX_SHRINKS = 64, 256
_MAX_SPLITS = 32
_MAX_BLOCK_K = 256  # in_features per shrink loop step
SYNC_WORDS = 4  # int32 counters: shrinks done, expands done, tickets (and one spare)


@triton.jit
def _shrink_rows(x_base, a_base, p_base, r0, k_start, k_end, stride_ar, MAX_RANK: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    # rows r0:r0+BLOCK_R of A (rows past MAX_RANK masked) times x over k_start:k_end, stored as fp32
    r = r0 + tl.arange(0, BLOCK_R)
    r_mask = r < MAX_RANK
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        k_offs = k + tl.arange(0, BLOCK_K)
        k_mask = k_offs < k_end
        xv = tl.load(x_base + k_offs, mask=k_mask, other=0.0).to(tl.float32)
        av = tl.load(a_base + r[:, None] * stride_ar + k_offs[None, :], mask=r_mask[:, None] & k_mask[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(p_base + r, acc)


@triton.jit
def _expand_rows(p_base, bv, r0, stride_ps, NUM_SPLITS: tl.constexpr, BLOCK_R: tl.constexpr):
    # sum of the splits' partials for rows r0:r0+BLOCK_R, times the B rows `bv` [BLOCK_R, BLOCK_N]
    splits = tl.arange(0, NUM_SPLITS)
    r = r0 + tl.arange(0, BLOCK_R)
    sv = tl.load(p_base + splits[:, None] * stride_ps + r[None, :], cache_modifier=".cg")
    s = tl.sum(sv, axis=0)
    return tl.sum(s[:, None] * bv.to(tl.float32), axis=0)


@triton.jit
def _lora_tiny_kernel(y_ptr, x_ptr, a_ptr, b_ptr, ranks_ptr, slots_ptr, part_ptr, sync_ptr, in_features, k_chunk,
                      num_slices, num_shrink, num_expand, num_blocks, off1, off2, off3, cb1, cb2, pid_base, stride_x,
                      stride_ai, stride_as, stride_ar, stride_bs, stride_br, stride_y, stride_ranks, stride_ps,
                      stride_pi, stride_pt, MAX_RANK: tl.constexpr, BLOCK_R: tl.constexpr,
                      NUM_SPLITS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, TICKET: tl.constexpr,
                      SYNC: tl.constexpr):
    # SYNC False: one of two launches (pid_base 0: the shrinks; num_shrink: the expands), no counters
    if TICKET:
        pid = tl.atomic_add(sync_ptr + 2, 1)
    else:
        pid = tl.program_id(0) + pid_base
    if pid < num_shrink:
        # ---- shrink role: (token t, slice sl, K chunk split) -> partial[split, sl, t, :]
        split = pid % NUM_SPLITS
        sl = (pid // NUM_SPLITS) % num_slices
        t = pid // (NUM_SPLITS * num_slices)
        slot = tl.load(slots_ptr + t)
        if slot >= 0:
            rank = tl.load(ranks_ptr + sl * stride_ranks + slot)
            a_base = a_ptr + sl.to(tl.int64) * stride_ai + slot.to(tl.int64) * stride_as
            x_base = x_ptr + t.to(tl.int64) * stride_x
            p_base = part_ptr + split * stride_ps + sl * stride_pi + t * stride_pt
            k_start = split * k_chunk
            k_end = tl.minimum(in_features, k_start + k_chunk)
            _shrink_rows(x_base, a_base, p_base, 0, k_start, k_end, stride_ar, MAX_RANK, BLOCK_R, BLOCK_K)
            for r0 in range(BLOCK_R, rank, BLOCK_R):
                _shrink_rows(x_base, a_base, p_base, r0, k_start, k_end, stride_ar, MAX_RANK, BLOCK_R, BLOCK_K)
        if SYNC:
            tl.debug_barrier()  # every thread's partial stores before the release
            tl.atomic_add(sync_ptr, 1, sem="release")
    else:
        # ---- expand role: (token t, column block j of the concatenated slices)
        e = pid - num_shrink
        j = e % num_blocks
        t = e // num_blocks
        sl = tl.where(j >= cb1, tl.where(j >= cb2, 2, 1), 0)
        first_block = tl.where(sl == 0, 0, tl.where(sl == 1, cb1, cb2))
        lo = tl.where(sl == 0, 0, tl.where(sl == 1, off1, off2))
        hi = tl.where(sl == 0, off1, tl.where(sl == 1, off2, off3))
        n = lo + (j - first_block) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = n < hi
        slot = tl.load(slots_ptr + t)
        safe = tl.maximum(slot, 0)
        y_row = y_ptr + t.to(tl.int64) * stride_y + n
        yv = tl.load(y_row, mask=n_mask, other=0.0)  # prefetched, as are the rank and B's first rows
        rank = tl.where(slot >= 0, tl.load(ranks_ptr + sl * stride_ranks + safe), 0)
        b_base = b_ptr + safe.to(tl.int64) * stride_bs + n[None, :]
        r = tl.arange(0, BLOCK_R)
        b_rows = tl.where(slot >= 0, MAX_RANK, 0)  # base tokens read no B
        bv = tl.load(b_base + r[:, None] * stride_br, mask=(r[:, None] < b_rows) & n_mask[None, :], other=0.0)
        cur = num_shrink
        if SYNC:
            # poll with acquire loads (an idempotent atomic becomes `ld.global.gpu.acquire` in the PTX; its result
            # must be used: unused, the compiler drops it) until every shrink program has released its partial,
            # so the partials' loads below are ordered after their stores
            cur = tl.atomic_add(sync_ptr, 0, sem="acquire")
            while cur < num_shrink:
                cur = tl.atomic_add(sync_ptr, 0, sem="acquire")
            tl.debug_barrier()
        if rank > 0:
            p_base = part_ptr + sl * stride_pi + t * stride_pt
            acc = _expand_rows(p_base, bv, 0, stride_ps, NUM_SPLITS, BLOCK_R)
            for r0 in range(BLOCK_R, rank, BLOCK_R):
                rr = r0 + tl.arange(0, BLOCK_R)
                bv2 = tl.load(b_base + rr[:, None] * stride_br, mask=(rr[:, None] < MAX_RANK) & n_mask[None, :],
                              other=0.0)
                acc += _expand_rows(p_base, bv2, r0, stride_ps, NUM_SPLITS, BLOCK_R)
            tl.store(y_row, (yv.to(tl.float32) + acc).to(y_ptr.dtype.element_ty), mask=n_mask)
        if SYNC:
            done = tl.atomic_add(sync_ptr + 1, 1)
            if done == num_expand - 1:  # the last program of the launch: zero the counters for the next one
                tl.atomic_xchg(sync_ptr, 0)
                tl.atomic_xchg(sync_ptr + 1, 0)
                tl.atomic_xchg(sync_ptr + 2, 0)


def plan(num_tokens: int, in_features: int, slice_sizes: list[int]) -> dict:
    """The launch's static shape for `num_tokens` tokens: split-K splits, K chunk and block, shrink and expand
    program counts, column blocks per slice. Depends only on shapes (a CUDA graph's grid is fixed)."""
    num_slices = len(slice_sizes)
    k_blocks = triton.cdiv(in_features, 64)
    target = min(_SHRINKS_PER_TOKEN * max(1, num_tokens), _MAX_SHRINKS)
    wanted = triton.cdiv(target, max(1, num_tokens * num_slices))
    # a power of two (the expand sums the partials as one [splits, 16] block), no split without K columns
    splits = min(_MAX_SPLITS, 1 << (max(1, min(wanted, k_blocks)).bit_length() - 1))
    k_chunk = triton.cdiv(k_blocks, splits) * 64
    blocks = [triton.cdiv(s, _BLOCK_N) for s in slice_sizes]
    return {"splits": splits, "k_chunk": k_chunk, "block_k": min(_MAX_BLOCK_K, triton.next_power_of_2(k_chunk)),
            "blocks": blocks, "num_shrink": num_tokens * num_slices * splits,
            "num_expand": num_tokens * sum(blocks)}


def _use_ticket(grid: int, device: torch.device) -> bool:
    if _TICKET_ENV is not None:
        return _TICKET_ENV != "0"
    if device.type != "cuda":
        return False
    return grid > torch.cuda.get_device_properties(device).multi_processor_count


def lora_tiny(
    y: torch.Tensor,  # [T, sum(slice_sizes)], updated in place (row stride free, column stride 1)
    x: torch.Tensor,  # [T, in_features]
    a: torch.Tensor,  # [num_slices, num_slots, max_rank, in_features], rows past each slot's rank zero
    b: torch.Tensor,  # [num_slots, max_rank, sum(slice_sizes)] (B transposed, scaled), rows past the rank zero
    ranks: torch.Tensor,  # [num_slices, num_slots] int32 (0: slice not targeted)
    token_slots: torch.Tensor,  # [>= T] int32: token t's slot, -1 for the base model / padding
    slice_sizes: list[int],  # host ints (1 to MAX_SLICES slices)
    sync: torch.Tensor,  # [>= SYNC_WORDS] int32 device counters, zero before the call (left zero after it)
    ticket: bool | None = None,  # None: `_use_ticket`
    two_launches: bool | None = None,  # None: TWO_LAUNCHES (env LORA_TINY_TWO_LAUNCHES)
) -> torch.Tensor:
    """`y[t, slice i] += B[slot(t), :rank, slice i]^T (A[i, slot(t), :rank] @ x[t])` for every token with a
    slot (fp32 products and sums, rounded once to y.dtype); other rows untouched. One launch of
    `num_shrink + num_expand` programs (`plan`), or with `two_launches` the shrinks and then the expands
    as two launches (no counters, no waiting; `ticket` ignored). Requires the layers' invariant that A and B rows past a
    slot's rank are zero (the first 16 rows are read before the rank is known). Raises ValueError on bad
    shapes, dtypes or devices."""
    check_tensor("y", y, 2, FLOAT_DTYPES)
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("a", a, 4, FLOAT_DTYPES)
    check_tensor("b", b, 3, FLOAT_DTYPES)
    check_tensor("ranks", ranks, 2, (torch.int32,))
    check_tensor("token_slots", token_slots, 1, (torch.int32,))
    check_tensor("sync", sync, 1, (torch.int32,))
    num_tokens, in_features = x.shape
    num_slices, num_slots, max_rank, a_in = a.shape
    sizes = [int(s) for s in slice_sizes]
    if not 1 <= num_slices <= MAX_SLICES or len(sizes) != num_slices or min(sizes) < 1:
        raise ValueError(f"need 1..{MAX_SLICES} slices matching a's {num_slices}, got sizes {sizes}")
    if a_in != in_features or tuple(y.shape) != (num_tokens, sum(sizes)) or \
            tuple(b.shape) != (num_slots, max_rank, sum(sizes)):
        raise ValueError(f"shapes disagree: y {tuple(y.shape)}, x {tuple(x.shape)}, a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}, slices {sizes}")
    if tuple(ranks.shape) != (num_slices, num_slots):
        raise ValueError(f"ranks must have shape {(num_slices, num_slots)}, got {tuple(ranks.shape)}")
    if token_slots.shape[0] < num_tokens or sync.shape[0] < SYNC_WORDS:
        raise ValueError(f"token_slots needs >= {num_tokens} entries and sync >= {SYNC_WORDS}")
    check_same_device(y=y, x=x, a=a, b=b, ranks=ranks, token_slots=token_slots, sync=sync)
    if not num_tokens or not max_rank:
        return y
    p = plan(num_tokens, in_features, sizes)
    rows = triton.cdiv(max_rank, _BLOCK_R) * _BLOCK_R
    partial = torch.empty(p["splits"], num_slices, num_tokens, rows, dtype=torch.float32, device=x.device)
    offs = [sum(sizes[: i + 1]) for i in range(num_slices)] + [sum(sizes)] * (MAX_SLICES - num_slices)
    cum = [sum(p["blocks"][: i + 1]) for i in range(num_slices)]
    cum += [cum[-1]] * (MAX_SLICES - num_slices)
    grid = p["num_shrink"] + p["num_expand"]
    two = TWO_LAUNCHES if two_launches is None else two_launches
    use_ticket = not two and (_use_ticket(grid, x.device) if ticket is None else ticket)
    launches = [(p["num_shrink"], 0), (p["num_expand"], p["num_shrink"])] if two else [(grid, 0)]
    for programs, pid_base in launches:
        _lora_tiny_kernel[(programs,)](
            y, x, a, b, ranks, token_slots, partial, sync, in_features, p["k_chunk"], num_slices, p["num_shrink"],
            p["num_expand"], cum[-1], offs[0], offs[1], offs[2], cum[0], cum[1], pid_base, x.stride(0), a.stride(0),
            a.stride(1), a.stride(2), b.stride(0), b.stride(1), y.stride(0), ranks.stride(0), partial.stride(0),
            partial.stride(1), partial.stride(2), MAX_RANK=max_rank, BLOCK_R=_BLOCK_R, NUM_SPLITS=p["splits"],
            BLOCK_K=p["block_k"], BLOCK_N=_BLOCK_N, TICKET=use_ticket, SYNC=not two, num_warps=4)
    return y
