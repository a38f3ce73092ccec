import math

import pytest
import torch
from _util import assert_rel_close

from kernels.rotary_embedding import apply_rotary_embedding, apply_rotary_embedding_ref, build_cos_sin_cache

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip


@pytest.mark.parametrize(
    "hq,hk,d,dtype", [(4, 4, 64, torch.float32), (9, 3, 64, torch.bfloat16), (8, 2, 128, torch.float16)]
)
def test_rotary_matches_reference(device, hq, hk, d, dtype):
    gen = torch.Generator().manual_seed(hq * d)
    cache = build_cos_sin_cache(d, 4096, 10000.0).to(device)
    positions = torch.randint(0, 4096, (7,), generator=gen).to(device)
    qkv = torch.randn(7, hq + 2 * hk, d, generator=gen).to(device=device, dtype=dtype)
    q, k = qkv[:, :hq], qkv[:, hq : hq + hk]  # strided views of a fused qkv tensor
    v_before = qkv[:, hq + hk :].clone()
    q_ref, k_ref = apply_rotary_embedding_ref(positions, q, k, cache)
    apply_rotary_embedding(positions, q, k, cache)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert_rel_close(q, q_ref, tol)
    assert_rel_close(k, k_ref, tol)
    assert torch.equal(qkv[:, hq + hk :], v_before)


def _hf_default_inv_freq(d, theta):
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))


def test_cos_sin_cache_default():
    cache = build_cos_sin_cache(64, 100, 10000.0)
    inv = _hf_default_inv_freq(64, 10000.0)
    assert cache.shape == (100, 64) and cache.dtype == torch.float32
    assert torch.equal(cache[:, :32], torch.outer(torch.arange(100).float(), inv).cos())
    assert math.isclose(cache[1, 32].item(), math.sin(1.0), rel_tol=1e-6)


def test_cos_sin_cache_llama3_frequency_bands():
    inv = _hf_default_inv_freq(128, 500000.0)
    cache = build_cos_sin_cache(128, 2, 500000.0, LLAMA3)
    got = torch.atan2(cache[1, 64:], cache[1, :64])  # position 1: the angle is inv_freq itself
    wavelen = 2 * math.pi / inv
    high = wavelen < 8192 / 4.0
    low = wavelen > 8192 / 1.0
    torch.testing.assert_close(got[high], inv[high])  # short wavelengths kept
    torch.testing.assert_close(got[low], inv[low] / 8.0)  # long wavelengths divided by factor
    mid = ~high & ~low
    assert mid.any() and ((got[mid] < inv[mid]) & (got[mid] > inv[mid] / 8.0)).all()
    with pytest.raises(ValueError, match="rope_type"):
        build_cos_sin_cache(128, 2, 1e4, {"rope_type": "yarn", "factor": 2.0})


def test_rotary_rejects_bad_inputs(device):
    cache = build_cos_sin_cache(64, 16, 1e4).to(device)
    q = torch.randn(3, 4, 64, device=device)
    pos = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        apply_rotary_embedding(pos, q, q.clone(), cache.double())
    with pytest.raises(ValueError, match="positions"):
        apply_rotary_embedding(pos[:2], q, q.clone(), cache)


@pytest.mark.gpu
def test_rotary_bf16_real_shapes():
    cache = build_cos_sin_cache(128, 131072, 500000.0, LLAMA3).cuda()
    positions = torch.randint(0, 131072, (4096,), device="cuda")
    q = torch.randn(4096, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    q_ref, k_ref = apply_rotary_embedding_ref(positions, q, k, cache)
    apply_rotary_embedding(positions, q, k, cache)
    assert_rel_close(q, q_ref, 8e-3)
    assert_rel_close(k, k_ref, 8e-3)
