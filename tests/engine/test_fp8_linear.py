"""`quantization="fp8"`: per-output-channel weight scales, dynamic per-token activation scales, the matmul
through `torch._scaled_mm` (run here on the CPU, where torch implements it with per-tensor scales, against a
float emulation: the CUDA path makes the row-wise call), layers quantised at load, and the CPU engine refusing
the flag with a clear message."""

from __future__ import annotations

import pytest
import torch

from shared_engine import LLM
from shared_engine.config import EngineConfig
from shared_engine.model_executor.layers.fp8_linear import (
    FP8_DTYPE,
    FP8_MAX,
    apply_linear,
    fp8_linear,
    fp8_linear_ref,
    quantize_linear_layers,
    quantize_rowwise,
)
from shared_engine.model_executor.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_rowwise_scales_map_each_rows_amax_to_448():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen) * torch.logspace(-3, 2, 48).unsqueeze(1)  # rows 5 decades apart
    w[7] = 0.0  # an all-zero row: finite scale, zeros back
    w_q, scale = quantize_rowwise(w)
    assert w_q.dtype == FP8_DTYPE and scale.shape == (48, 1) and scale.dtype == torch.float32
    assert torch.equal(w_q.float().abs().amax(1)[torch.arange(48) != 7], torch.full((47,), FP8_MAX))
    back = w_q.float() * scale
    assert torch.equal(back[7], torch.zeros(64))
    big = (w / scale).abs() >= 2.0**-6  # e4m3 normal range: relative error <= 2^-4 per element
    assert ((back - w).abs()[big] <= 2.0**-4 * w.abs()[big]).all()
    # per-row scales keep each row's relative error small although the rows differ by 1e5
    assert max(rel_err(back[r], w[r]) for r in range(48) if r != 7) < 0.05


@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 64), (0, 64)])
def test_scaled_mm_equals_float_emulation_and_stays_near_the_float_matmul(shape):
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=gen)
    x[..., 0] *= 50  # an outlier channel
    w, bias = torch.randn(32, 64, generator=gen) * 0.02, torch.randn(32, generator=gen)
    w_q, w_scale = quantize_rowwise(w)
    out = fp8_linear(x, w_q, w_scale.view(-1), bias)
    assert out.shape == (*shape[:-1], 32) and out.dtype == x.dtype
    if x.numel() == 0:
        return
    ref = fp8_linear_ref(x, w_q, w_scale.view(-1), bias)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)  # the same maths, fp32 accumulation
    exact = x @ w.t() + bias
    assert rel_err(out, exact) < 0.06  # measured about 0.03: two e4m3 roundings (2^-4 worst case each)


def test_quantised_layers_run_fp8_and_track_the_float_layers():
    torch.manual_seed(1)
    col = ColumnParallelLinear(64, [48, 16], [(0, 48), (0, 16)], bias=True)
    row = RowParallelLinear(64, (0, 64), 32, bias=True)
    model = torch.nn.ModuleDict({"col": col, "row": row})
    x = torch.randn(7, 64)
    before = (col(x).detach(), row(x).detach())
    assert quantize_linear_layers(model) == 2 and quantize_linear_layers(model) == 0  # idempotent
    assert col.weight.dtype == FP8_DTYPE and col.weight_scale.shape == (64,)
    assert row.weight.dtype == FP8_DTYPE and row.weight_scale.shape == (32,)
    with torch.no_grad():
        after = (col(x), row(x))
        assert torch.equal(after[0], apply_linear(col, x))
    for a, b in zip(after, before):
        assert 0 < rel_err(a, b) < 0.06


def test_cpu_engine_refuses_fp8_quantization_naming_the_flag(tiny_model_dir):
    # device="cpu": on a CUDA machine "auto" would pick the GPU (which runs FP8) and fail elsewhere first
    with pytest.raises(ValueError, match=r"--quantization fp8.*CUDA GPU with FP8 tensor cores.*cpu"):
        LLM(model=str(tiny_model_dir), load_format="dummy", quantization="fp8", device="cpu",
            num_gpu_blocks_override=64)
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig.from_flat(quantization="int4")


@pytest.mark.gpu
def test_cuda_engine_refuses_fp8_quantization_of_a_float32_model(tiny_model_dir):
    """_scaled_mm's row-wise scaling writes bf16: a float32 model on the GPU is refused before it loads."""
    with pytest.raises(ValueError, match=r"--quantization fp8 needs --dtype bfloat16.*float32"):
        LLM(model=str(tiny_model_dir), load_format="dummy", quantization="fp8", device="cuda", dtype="float32",
            num_gpu_blocks_override=64)


@pytest.mark.gpu
def test_llama_8b_shapes_quantised_on_cuda():
    """Real llama-3.1-8b projection shapes on the H200: `_scaled_mm` equals the float emulation (bf16 out)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]:
        w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
        x = torch.randn(256, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        w_q, w_scale = quantize_rowwise(w)
        out = fp8_linear(x, w_q, w_scale.view(-1))
        assert rel_err(out, fp8_linear_ref(x, w_q, w_scale.view(-1))) < 1e-2  # bf16 output rounding
        assert rel_err(out, (x.float() @ w.float().t())) < 0.06
