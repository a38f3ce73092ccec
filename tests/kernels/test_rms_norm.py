import pytest
import torch
from _util import assert_rel_close

from kernels.rms_norm import rms_norm, rms_norm_ref


def _hf_llama_rms_norm(x, weight, eps):
    """HF LlamaRMSNorm.forward, written out as the spec to match."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


@pytest.mark.parametrize(
    "num_tokens,hidden,dtype",
    [(5, 64, torch.float32), (3, 96, torch.float16), (7, 576, torch.bfloat16), (1, 1000, torch.float32)],
)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(device, num_tokens, hidden, dtype, with_residual):
    gen = torch.Generator().manual_seed(hidden + num_tokens)
    x = (torch.randn(num_tokens, hidden, generator=gen) * 3).to(device=device, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    residual = (
        torch.randn(num_tokens, hidden, generator=gen).to(device=device, dtype=dtype)
        if with_residual
        else None
    )
    got = rms_norm(x, weight, 1e-6, residual=residual)
    ref = rms_norm_ref(x, weight, 1e-6, residual=residual)
    if with_residual:
        (got, got_r), (ref, ref_r) = got, ref
        assert torch.equal(ref_r, x + residual)
        if device == "cuda" or dtype != torch.bfloat16:
            assert torch.equal(got_r, ref_r)
        else:  # Triton's interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest even)
            assert_rel_close(got_r, ref_r, 8e-3)
    # one rounding of the final product can differ (fp32 rsqrt vs torch's): at most 1 ulp of dtype
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert_rel_close(got, ref, tol)
    hf = _hf_llama_rms_norm(ref_r if with_residual else x, weight, 1e-6)
    assert_rel_close(ref, hf, 1e-6 if dtype == torch.float32 else 0.0 + tol)


def test_rms_norm_strided_rows(device):
    x = torch.randn(4, 2, 64, device=device)[:, 0]  # row stride 128
    weight = torch.randn(64, device=device)
    assert_rel_close(rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5), 1e-6)


def test_rms_norm_rejects_bad_inputs(device):
    x = torch.randn(4, 64, device=device)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.randn(32, device=device), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, torch.randn(64, device=device), 1e-5, residual=x.half())
    with pytest.raises(ValueError, match="stride 1"):
        rms_norm(x.t(), torch.randn(4, device=device), 1e-5)


@pytest.mark.gpu
def test_rms_norm_bf16_real_shapes():
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    (got, got_r), (ref, ref_r) = rms_norm(x, w, 1e-5, r), rms_norm_ref(x, w, 1e-5, r)
    assert torch.equal(got_r, ref_r)
    assert_rel_close(got, ref, 8e-3)
