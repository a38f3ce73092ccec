import pytest
import torch
from _util import assert_rel_close, poisoned

from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref


@pytest.mark.parametrize(
    "num_tokens,d,dtype", [(3, 64, torch.float32), (5, 1536, torch.bfloat16), (2, 100, torch.float16)]
)
def test_silu_and_mul_matches_reference(device, num_tokens, d, dtype):
    gen = torch.Generator().manual_seed(d)
    x = (2 * torch.randn(num_tokens, 2 * d, generator=gen)).to(device=device, dtype=dtype)
    out = poisoned((num_tokens, d), dtype, device)
    silu_and_mul(x, out=out)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert_rel_close(out, silu_and_mul_ref(x), tol)


def test_silu_and_mul_rejects_bad_inputs(device):
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(2, 7, device=device))
    with pytest.raises(ValueError, match="out"):
        silu_and_mul(torch.randn(2, 8, device=device), out=torch.empty(2, 8, device=device))


@pytest.mark.gpu
def test_silu_and_mul_bf16_real_shapes():
    x = torch.randn(2048, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    assert_rel_close(silu_and_mul(x), silu_and_mul_ref(x), 8e-3)
