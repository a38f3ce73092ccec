"""Which SGMV path the model's LoRA layer takes (TRITON_INTERPRET=1 on the CPU): the fused one-launch kernel
(kernels/lora_sgmv_fused.py `sgmv_fused`) for steps of at most FUSED_MAX_TOKENS rows, the two SGMV kernels above
it and when the threshold is 0 (LORA_FUSED_MAX_TOKENS=0, the A/B switch of the GPU benchmarks); every path
equals the masked torch path."""

from __future__ import annotations

import torch


def test_layer_takes_fused_kernel_up_to_threshold(device, monkeypatch):
    import kernels.lora_sgmv_fused as sgmv
    import kernels.lora_tiny as tiny
    from shared_engine.model_executor.layers.lora import LoRAContext, LoRAProjection

    g = torch.Generator().manual_seed(11)
    dev = torch.device(device)
    ctx = LoRAContext(max_num_tokens=32, max_loras=3, dtype=torch.float32, device=dev)
    layer = LoRAProjection(ctx, 24, [16, 8, 8], max_rank=8, dtype=torch.float32, device=dev)
    for slot, rank in [(0, 8), (2, 3)]:  # slot 1 empty; slot 2 does not target k
        for i, size in enumerate([16, 8, 8]):
            if (slot, i) != (2, 1):
                layer.write_slot(slot, i, torch.randn(rank, 24, generator=g).to(dev),
                                 torch.randn(size, rank, generator=g).to(dev))
    monkeypatch.setattr(tiny, "TINY_MAX_TOKENS", 0)  # lora_tiny (default for <= 8 tokens) takes precedence
    calls = []
    fused = sgmv.sgmv_fused
    monkeypatch.setattr(sgmv, "sgmv_fused", lambda *a, **k: calls.append(a[1].shape[0]) or fused(*a, **k))
    ctx.active = True
    limit = 2  # the threshold under test (the default, sgmv.FUSED_MAX_TOKENS, is 0: off after the H200 run)
    for threshold, slots in [(limit, [2]), (limit, [0, -1, 2, 1, 0][: max(1, limit)]),
                             (limit, [0, -1, 2, 2, 0, -1, 1, 2, 0][: limit + 1]), (0, [2])]:
        monkeypatch.setattr(sgmv, "FUSED_MAX_TOKENS", threshold)
        ctx.kernel = "torch"
        ctx.set_token_slots(torch.tensor(slots))
        x, base = (torch.randn(len(slots), n, generator=g).to(dev) for n in (24, 32))
        expected = layer(x, base.clone())
        ctx.kernel = "sgmv"
        calls.clear()
        got = layer(x, base.clone())
        assert calls == ([len(slots)] if len(slots) <= threshold else []), (threshold, len(slots), calls)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(got, base)
