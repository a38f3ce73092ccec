"""Fused sampling: one kernel turns fp32 logits into token ids, greedy or temperature sampling per row.

Sampling uses the Gumbel-max trick: argmax_i(logits_i / T + g_i) with g_i = -log(-log(u_i)) i.i.d.
Gumbel(0, 1) is distributed as softmax(logits / T) (Gumbel 1954; e.g. Huijben et al. 2022, "A Review of
the Gumbel-max Trick"). The uniforms u_i come from Triton's counter-based Philox generator with key
`seeds[row]` and counter `offsets[row] * vocab + i`, so a (seed, offset) pair always gives the same token,
nothing is read back to the host, and the kernel can be captured in a CUDA graph. No top-k / top-p:
callers that need them mask the logits to -inf first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor, device_num_sms


def sample_tokens_ref(
    logits: torch.Tensor,  # [num_seqs, vocab] float32
    temperatures: torch.Tensor,  # [num_seqs] float32, 0 = greedy
    generator: torch.Generator | None = None,
) -> torch.Tensor:  # [num_seqs] int64
    """Pure-torch reference sampler: argmax for T == 0, else a draw from softmax(logits / T).

    Same distribution as `sample_tokens`, not the same random stream.
    """
    greedy = logits.argmax(dim=-1)
    t = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    probs = torch.softmax(logits.float() / t[:, None], dim=-1)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return torch.where(temperatures > 0, sampled, greedy)


@triton.jit
def _sample_kernel(
    logits_ptr, temp_ptr, seed_ptr, offset_ptr, best_val_ptr, best_idx_ptr,
    vocab, split_len, stride_l, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Best (key, index) of one vocab slice of one row; keys: logits (greedy) or logits / T + Gumbel."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    seed = tl.load(seed_ptr + row)
    counter0 = tl.load(offset_ptr + row) * vocab
    sampled = temp > 0
    inv_t = 1.0 / tl.where(sampled, temp, 1.0)
    best_val = float("-inf")
    best_idx = 0
    row_ptr = logits_ptr + row.to(tl.int64) * stride_l
    start = split * split_len
    for v0 in range(start, tl.minimum(start + split_len, vocab), BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < vocab
        x = tl.load(row_ptr + offs, mask=mask, other=float("-inf"))
        if sampled:
            u = tl.rand(seed, counter0 + offs)  # [0, 1); u == 0 gives -inf, never chosen
            x = x * inv_t - tl.log(-tl.log(u))
        x = tl.where(mask & (x == x), x, float("-inf"))  # NaN logits never win
        blk_idx = tl.argmax(x, 0)  # first maximum, like torch.argmax
        blk_val = tl.max(x, 0)
        better = blk_val > best_val  # strict: earlier blocks win ties
        best_idx = tl.where(better, v0 + blk_idx, best_idx)
        best_val = tl.where(better, blk_val, best_val)
    out = row * tl.num_programs(1) + split
    tl.store(best_val_ptr + out, best_val)
    tl.store(best_idx_ptr + out, best_idx.to(tl.int64))


def sample_tokens(
    logits: torch.Tensor,  # [num_seqs, vocab] float32
    temperatures: torch.Tensor,  # [num_seqs] float32, 0 = greedy
    seeds: torch.Tensor,  # [num_seqs] int64, Philox key of the row's random stream
    offsets: torch.Tensor,  # [num_seqs] int64, position in that stream (e.g. the decode step)
    out: torch.Tensor | None = None,  # [num_seqs] int64
) -> torch.Tensor:  # [num_seqs] int64 token ids
    """Greedy (T == 0: argmax, first index on ties) or sampled (T > 0: softmax(logits / T)) token per row.

    A row's draw is a pure function of (logits row, T, seed, offset): advance `offsets` each step for
    fresh randomness. Offsets below 2**63 / vocab keep the counters distinct.
    Raises ValueError on bad shapes, dtypes or layouts.
    """
    check_tensor("logits", logits, 2, (torch.float32,))
    check_tensor("temperatures", temperatures, 1, (torch.float32,), contiguous=True)
    check_tensor("seeds", seeds, 1, (torch.int64,), contiguous=True)
    check_tensor("offsets", offsets, 1, (torch.int64,), contiguous=True)
    check_same_device(logits=logits, temperatures=temperatures, seeds=seeds, offsets=offsets)
    num_seqs, vocab = logits.shape
    for name, t in (("temperatures", temperatures), ("seeds", seeds), ("offsets", offsets)):
        if t.shape[0] != num_seqs:
            raise ValueError(f"{name} must have {num_seqs} entries, got {t.shape[0]}")
    if vocab == 0:
        raise ValueError("logits must have a non-empty vocab dim")
    if out is None:
        out = torch.empty(num_seqs, dtype=torch.int64, device=logits.device)
    check_tensor("out", out, 1, (torch.int64,), contiguous=True)
    if out.shape[0] != num_seqs:
        raise ValueError(f"out must have {num_seqs} entries, got {out.shape[0]}")
    if num_seqs > 0:
        block_v = min(4096, triton.next_power_of_2(vocab))
        # split each row's vocab so that large and small batches alike fill the GPU (~4 programs per SM)
        num_blocks = triton.cdiv(vocab, block_v)
        num_splits = max(1, min(num_blocks, triton.cdiv(4 * device_num_sms(logits.device), num_seqs)))
        split_len = triton.cdiv(num_blocks, num_splits) * block_v
        num_splits = triton.cdiv(vocab, split_len)
        best_val = torch.empty(num_seqs, num_splits, dtype=torch.float32, device=logits.device)
        best_idx = torch.empty(num_seqs, num_splits, dtype=torch.int64, device=logits.device)
        _sample_kernel[(num_seqs, num_splits)](
            logits, temperatures, seeds, offsets, best_val, best_idx, vocab, split_len, logits.stride(0),
            BLOCK_V=block_v, num_warps=8,
        )  # fmt: skip
        # first slice among equal maxima = lowest token id, as torch.argmax
        torch.gather(best_idx, 1, best_val.argmax(dim=1, keepdim=True), out=out.view(num_seqs, 1))
    return out
