"""Helpers shared by the kernel tests: tolerances, poisoned outputs, random paged KV caches."""

from __future__ import annotations

import torch

# ||out - ref|| / ||ref|| bounds: fp32 on the interpreter is exact-ish; on CUDA tl.dot of fp32 uses tf32.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
REL_TOL_TF32 = 2e-3


def rel_tol(dtype: torch.dtype, device: str, uses_dot: bool = False) -> float:
    if dtype == torch.float32 and device == "cuda" and uses_dot:
        return REL_TOL_TF32
    return REL_TOL[dtype]


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """No NaN/inf anywhere (outputs are poisoned first), and a small relative L2 error."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), (
        f"{(~torch.isfinite(out)).sum().item()} non-finite (unwritten?) elements"
    )
    err = (out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)
    assert err <= tol, f"relative error {err:.3e} > {tol:.1e}"


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def make_paged_kv(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    extra_blocks: int = 3,
    gen: torch.Generator | None = None,
):
    """Random K/V caches and a shuffled block table covering `context_lens` tokens per sequence.

    Returns k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], block_tables int32
    [num_seqs, max_blocks_per_seq + 1] (unused entries 0) and context_lens int32 [num_seqs].
    """
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + extra_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.zeros(len(context_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    used = 0
    for s, nb in enumerate(blocks_per_seq):
        block_tables[s, :nb] = perm[used : used + nb].int()
        used += nb
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return k_cache, v_cache, block_tables.to(device), lens.to(device)
