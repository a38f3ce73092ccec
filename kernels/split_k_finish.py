"""Serial split-K reduction for decode attention: the last program of each (sequence, kv head) to finish
merges every split's partial output, in the same launch (no second kernel, no zeroing launch).

Each split program stores its partial (normalised output, log2-domain log-sum-exp) for the query heads of
its GQA group, then takes a ticket from a per-(sequence, kv head) int32 counter (`tl.atomic_add`,
acq_rel, gpu scope, after a CTA barrier so every thread's stores precede the release: CUTLASS's
`arrive_inc` pattern). The program that draws ticket num_splits - 1 knows every partial is visible, merges
them (loads bypass L1: `.cg`), writes the output and puts the counter back to 0. The counters therefore
read 0 between launches: allocated zeroed once per device (`split_counters`), never reset by the host, so
the launch is safe inside a CUDA graph and replays. Launches that share a counter buffer must not run
concurrently (one stream; pass your own buffer otherwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Counters per device: (sequences x kv heads) slots. Split-K only pays below about two programs per SM
# (seqs x kv heads < ~264 on an H200), so 8,192 is ample; the launcher falls back to the two-kernel path
# past it. Never freed or regrown: a captured graph keeps the pointer it was captured with.
COUNTER_SLOTS = 8192
_COUNTERS: dict[str, torch.Tensor] = {}


def split_counters(device: torch.device) -> torch.Tensor:
    """The device's zeroed int32 [COUNTER_SLOTS] counter buffer (allocated on first use; allocate it
    outside graph capture, e.g. on the warm-up call, so it is not in a graph's private pool)."""
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return _COUNTERS[key]


@triton.jit
def last_split_merges(
    counter_ptr, part_out_ptr, part_lse_ptr, out_ptr, row0, num_splits, num_merged, stride_oh,
    QUERIES_PER_KV: tl.constexpr, Q_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, REDUCE_TILE: tl.constexpr,
    MERGE_2D: tl.constexpr = False,
):  # fmt: skip
    """Called by every split program after storing its partials. `counter_ptr`: this (sequence, kv head)'s
    int32 counter; `row0`: the partial row of its first query head's split 0 (rows are [query head, split],
    each HEAD_DIM fp32; the group's QUERIES_PER_KV heads are consecutive); `out_ptr`: its first query head's
    output row. All num_splits programs count; the last merges splits 0..num_merged-1 (those that read KV),
    REDUCE_TILE per round of loads (one round when num_merged <= REDUCE_TILE) with an online log-sum-exp;
    empty splits (lse -inf) weigh 0, an empty context gives 0. MERGE_2D: one query head at a time in 2-D
    [REDUCE_TILE, HEAD_DIM] tiles, the loop not software-pipelined (the simpler code, against the 3-D one)."""
    tl.debug_barrier()  # all of this program's partial stores happen before the release of the ticket
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == num_splits - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")  # every other program has counted
        if MERGE_2D:
            merge_heads_2d(part_out_ptr, part_lse_ptr, out_ptr, row0, num_splits, num_merged, stride_oh,
                           QUERIES_PER_KV, HEAD_DIM, REDUCE_TILE)
        else:
            offs_g = tl.arange(0, Q_PAD)
            offs_s = tl.arange(0, REDUCE_TILE)
            offs_d = tl.arange(0, HEAD_DIM)
            g_mask = offs_g < QUERIES_PER_KV
            m = tl.full([Q_PAD], float("-inf"), dtype=tl.float32)
            total = tl.zeros([Q_PAD], dtype=tl.float32)
            acc = tl.zeros([Q_PAD, HEAD_DIM], dtype=tl.float32)
            for s0 in range(0, num_merged, REDUCE_TILE):
                split = s0 + offs_s
                mask = g_mask[:, None] & (split < num_merged)[None, :]  # [Q_PAD, REDUCE_TILE]
                rows = row0 + offs_g[:, None] * num_splits + split[None, :]
                lse = tl.load(part_lse_ptr + rows, mask=mask, other=float("-inf"), cache_modifier=".cg")
                part = tl.load(part_out_ptr + rows[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                               mask=mask[:, :, None], other=0.0, cache_modifier=".cg")
                m_new = tl.maximum(m, tl.max(lse, 1))
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # all splits so far empty: weights 0
                rescale = tl.exp2(m - m_ref)
                w = tl.exp2(lse - m_ref[:, None])  # [Q_PAD, REDUCE_TILE]
                acc = acc * rescale[:, None] + tl.sum(part * w[:, :, None], 1)
                total = total * rescale + tl.sum(w, 1)
                m = m_new
            out = acc / tl.where(total > 0, total, 1.0)[:, None]
            o_ptrs = out_ptr + offs_g[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit
def merge_heads_2d(
    part_out_ptr, part_lse_ptr, out_ptr, row0, num_splits, num_merged, stride_oh,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, REDUCE_TILE: tl.constexpr,
):  # fmt: skip
    """last_split_merges' merge, one query head after another (see there for the arguments)."""
    offs_s = tl.arange(0, REDUCE_TILE)
    offs_d = tl.arange(0, HEAD_DIM)
    for g in tl.static_range(QUERIES_PER_KV):
        m = tl.max(tl.full([REDUCE_TILE], float("-inf"), dtype=tl.float32), 0)
        total = tl.sum(tl.zeros([REDUCE_TILE], dtype=tl.float32), 0)
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        for s0 in tl.range(0, num_merged, REDUCE_TILE, num_stages=1):
            split = s0 + offs_s
            mask = split < num_merged
            rows = row0 + g * num_splits + split
            lse = tl.load(part_lse_ptr + rows, mask=mask, other=float("-inf"), cache_modifier=".cg")
            part = tl.load(part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=mask[:, None],
                           other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse, 0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            rescale = tl.exp2(m - m_ref)
            w = tl.exp2(lse - m_ref)
            acc = acc * rescale + tl.sum(part * w[:, None], 0)
            total = total * rescale + tl.sum(w, 0)
            m = m_new
        out = acc / tl.where(total > 0, total, 1.0)
        tl.store(out_ptr + g * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))
