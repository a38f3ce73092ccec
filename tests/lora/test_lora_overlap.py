"""LoRAProjection.apply: the base GEMM plus each token's delta, with the SGMV shrink on a side stream while a
CUDA graph is captured (shared_engine/model_executor/layers/lora.py). Equal to `forward(x, base(x))` on the
CPU (no side stream) and, on CUDA, a captured graph that forks the shrink replays the eager torch path's
output; LORA_OVERLAP=0 (the module's OVERLAP False) captures without the fork."""

from __future__ import annotations

import pytest
import torch

from shared_engine.model_executor.layers import lora as lora_mod
from shared_engine.model_executor.layers.lora import LoRAContext, LoRAProjection

SIZES = [64, 16, 16]  # a small fused qkv: q, k, v


def _layer(dev, g):
    ctx = LoRAContext(max_num_tokens=32, max_loras=3, dtype=torch.float32, device=dev)
    layer = LoRAProjection(ctx, 48, SIZES, max_rank=8, dtype=torch.float32, device=dev, group="qkv")
    for slot, rank in [(0, 8), (2, 4)]:  # slot 1 empty; slot 2 does not target k
        for i, size in enumerate(SIZES):
            if (slot, i) != (2, 1):
                layer.write_slot(slot, i, torch.randn(rank, 48, generator=g).to(dev),
                                 torch.randn(size, rank, generator=g).to(dev))
    ctx.active = True
    return ctx, layer


def test_apply_equals_forward_on_cpu():
    g = torch.Generator().manual_seed(5)
    ctx, layer = _layer(torch.device("cpu"), g)
    weight = torch.randn(sum(SIZES), 48, generator=g)
    base = lambda x: x @ weight.t()  # noqa: E731
    ctx.set_token_slots(torch.tensor([0, -1, 2, 1, 0]))
    x = torch.randn(5, 48, generator=g)
    assert ctx.overlap_stream() is None
    got = layer.apply(x, base)
    torch.testing.assert_close(got, layer(x, base(x)))
    assert not torch.allclose(got[[0, 2, 4]], base(x)[[0, 2, 4]])  # the adapter rows moved
    torch.testing.assert_close(got[[1, 3]], base(x)[[1, 3]])  # base row and empty slot: untouched
    ctx.active = False
    torch.testing.assert_close(layer.apply(x, base), base(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and streams need a GPU")
@pytest.mark.parametrize("overlap", [True, False])
def test_captured_fork_replays_eager_torch_path(overlap, monkeypatch):
    monkeypatch.setattr(lora_mod, "OVERLAP", overlap)
    import kernels.lora_tiny as tiny

    monkeypatch.setattr(tiny, "TINY_MAX_TOKENS", 0)  # steps of <= 8 tokens would take lora_tiny, never forked
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(7)
    ctx, layer = _layer(dev, g)
    assert (ctx._side is not None) == overlap
    weight = torch.randn(sum(SIZES), 48, generator=g).to(dev)
    forks = []

    def base(x):
        forks.append(torch.cuda.current_stream() != ctx._side and ctx.overlap_stream() is not None)
        return x @ weight.t()

    x_static = torch.zeros(8, 48, device=dev)
    ctx.set_token_slots(torch.tensor([0, -1, 2, 1, 0, 0, 2, -1]))
    layer.apply(x_static, base)  # warm-up (Triton JIT) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    forks.clear()
    with torch.cuda.graph(graph):
        y_static = layer.apply(x_static, base)
    assert forks == [overlap]  # the GEMM ran on the compute stream with the side stream forked
    for slots in ([0, -1, 2, 1, 0, 0, 2, -1], [2, 2, 2, 2, -1, -1, 0, 0]):
        x = torch.randn(8, 48, generator=g).to(dev)
        ctx.set_token_slots(torch.tensor(slots))
        x_static.copy_(x)
        graph.replay()
        ctx.kernel = "torch"
        ctx.set_token_slots(torch.tensor(slots))
        expected = layer(x, x @ weight.t())
        ctx.kernel = "sgmv"
        torch.cuda.synchronize()
        torch.testing.assert_close(y_static, expected, rtol=1e-4, atol=1e-4)
