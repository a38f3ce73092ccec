"""Per-token FP8 activation quantisation: the kernel is bit-equal to the torch reference (scales and e4m3 codes),
including an all-zero row, an outlier row, a K that is not a power of two and strided rows."""

import pytest
import torch

from kernels.fp8 import FP8_MAX, ieee_div, quantize_fp8_ref
from kernels.fp8_quant import quantize_per_token, quantize_per_token_ref


@pytest.mark.parametrize("m,k,dtype", [(5, 64, torch.float32), (3, 1000, torch.float32), (2, 2304, torch.float16)])
def test_kernel_equals_reference_bitwise(device, m, k, dtype):
    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(m, k + 8, generator=gen) * torch.logspace(-4, 3, m).unsqueeze(1))[:, 4:k + 4]  # strided rows
    x[0] = 0.0
    x = x.to(device=device, dtype=dtype)
    q, scale = quantize_per_token(x)
    q_ref, scale_ref = quantize_per_token_ref(x)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(q[1:].float().abs().amax(1), torch.full((m - 1,), FP8_MAX, device=device))


def test_rejects_bad_input(device):
    with pytest.raises(ValueError, match="dims"):
        quantize_per_token(torch.randn(2, 3, 4, device=device))
    q, s = quantize_per_token(torch.randn(0, 16, device=device))
    assert q.shape == (0, 16) and s.shape == (0, 1)


def test_references_divide_exactly_on_every_device(device):
    """The torch references divide as the kernels' div_rn on every device: CUDA's `x / 448.0` is
    `x * (1 / 448)`, off by one ulp for about a quarter of the inputs (the per-token scales then differ)."""
    x = torch.rand(4096, generator=torch.Generator().manual_seed(2)) * 100 + 1e-3
    exact = x / 448.0  # the CPU: IEEE division
    assert torch.equal(ieee_div(x.to(device), 448.0).cpu(), exact)
    assert torch.equal(quantize_per_token_ref(x.view(64, 64).to(device))[1].cpu().view(-1),
                       x.view(64, 64).abs().amax(1) / 448.0)
    assert torch.equal(quantize_fp8_ref(x.to(device), 0.05).cpu().view(torch.uint8),
                       (x / 0.05).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8))
