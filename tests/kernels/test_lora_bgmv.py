"""The LoRA shrink/expand kernels against their pure-torch references (TRITON_INTERPRET=1 on the CPU, small
shapes): mixed ranks and base-model tokens in one batch, irregular sizes, a column slice of a fused output."""

from __future__ import annotations

import pytest
import torch

from kernels.lora_bgmv import lora_expand, lora_expand_ref, lora_shrink, lora_shrink_ref


def case(num_tokens, in_features, out_features, ranks, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    num_slots, max_rank = len(ranks), max(ranks)
    x = torch.randn(num_tokens, in_features, generator=g).to(device, dtype)
    a = torch.randn(num_slots, max_rank, in_features, generator=g).to(device, dtype)
    b = torch.randn(num_slots, max_rank, out_features, generator=g).to(device, dtype)
    slots = torch.randint(-1, num_slots, (num_tokens,), generator=g).to(device)
    return x, a, b, slots, torch.tensor(ranks, device=device)


@pytest.mark.parametrize("num_tokens,in_features,out_features,ranks", [
    (1, 64, 48, [8]), (7, 100, 33, [4, 16, 8]), (19, 300, 260, [2, 8, 16, 1]), (5, 32, 16, [16, 16]),
    (3, 1100, 40, [4, 8])])  # 1100: three split-K chunks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_expand_match_reference(num_tokens, in_features, out_features, ranks, dtype, device):
    x, a, b, slots, rank_t = case(num_tokens, in_features, out_features, ranks, dtype, device=device)
    s = lora_shrink(x, a, slots, rank_t)
    torch.testing.assert_close(s, lora_shrink_ref(x, a, slots, rank_t), rtol=1e-4, atol=1e-3)
    y = torch.randn(num_tokens, out_features).to(device, dtype)
    expected = lora_expand_ref(y, s, b, slots, rank_t)
    lora_expand(y, s, b, slots, rank_t)
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=2e-2, atol=0.1)
    torch.testing.assert_close(y, expected, **tol)
    base = (slots < 0).nonzero().flatten()
    assert torch.all(s[base] == 0)


def test_expand_into_a_column_slice_and_bad_shapes(device):
    x, a, b, slots, ranks = case(6, 40, 24, [4, 8], torch.float32, seed=3, device=device)
    fused = torch.randn(6, 60, device=device)
    y = fused[:, 10:34]  # the k slice of a fused qkv output: strided rows
    expected = lora_expand_ref(y.clone(), lora_shrink_ref(x, a, slots, ranks), b, slots, ranks)
    lora_expand(y, lora_shrink(x, a, slots, ranks), b, slots, ranks)
    torch.testing.assert_close(fused[:, 10:34], expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="in_features"):
        lora_shrink(x[:, :30], a, slots, ranks)
    with pytest.raises(ValueError, match="ranks must have 2"):
        lora_shrink(x, a, slots, ranks[:1])


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,in_features,out_features,rank", [(256, 4096, 4096, 16), (2048, 4096, 1024, 64),
                                                                      (1, 14336, 4096, 8)])
def test_real_shapes_bf16_on_gpu(num_tokens, in_features, out_features, rank):
    """llama-3.1-8b projections in bf16 with 30 slots of mixed ranks (8/16/64 up to `rank`)."""
    ranks = [[8, 16, 64][i % 3] if rank == 64 else rank for i in range(30)]
    x, a, b, slots, rank_t = case(num_tokens, in_features, out_features, ranks, torch.bfloat16, device="cuda")
    s = lora_shrink(x, a, slots, rank_t)
    ref_s = torch.zeros_like(s)
    valid = slots >= 0
    full = torch.einsum("tri,ti->tr", a[slots.clamp(min=0)].float(), x.float())
    keep = torch.arange(a.shape[1], device="cuda")[None, :] < rank_t[slots.clamp(min=0)][:, None]
    ref_s[valid] = (full * keep)[valid]
    torch.testing.assert_close(s, ref_s, rtol=1e-3, atol=1e-2)
    y = torch.randn(num_tokens, out_features, device="cuda").bfloat16()
    expected = y.float() + torch.einsum("tr,tro->to", s, b[slots.clamp(min=0)].float()) * valid[:, None]
    lora_expand(y, s, b, slots, rank_t)
    torch.testing.assert_close(y.float(), expected, rtol=2e-2, atol=0.5)


@pytest.mark.parametrize("kernel", ["sgmv", "sgmv_tiles64", "bgmv"])
def test_lora_layer_kernel_path_equals_torch_path(kernel, device):
    """The model's LoRA layer gives the same output through either kernel as through the masked torch path
    (fused q/k/v slices of unequal widths, adapters of different ranks, an untargeted slice, an empty slot,
    base-model tokens, a segment longer than one SGMV tile, steps of one and two tokens), and the context's
    slots follow a refill."""
    from shared_engine.model_executor.layers.lora import LoRAContext, LoRAProjection

    g = torch.Generator().manual_seed(5)
    dev = torch.device(device)
    ctx = LoRAContext(max_num_tokens=48, max_loras=3, dtype=torch.float32, device=dev)
    layer = LoRAProjection(ctx, 24, [16, 8, 8], max_rank=8, dtype=torch.float32, device=dev)
    for slot, rank in [(0, 8), (2, 3)]:
        for i, size in enumerate([16, 8, 8]):
            a, b = (torch.randn(rank, 24, generator=g), torch.randn(size, rank, generator=g)) if (slot, i) != (2, 1) \
                else (None, None)
            layer.write_slot(slot, i, *((None, None) if a is None else (a.to(dev), b.to(dev))))
    ctx.active = True
    # slot 1 is empty: adds zeros; one and two tokens: SGMV's fused single launch (batch-1 decodes)
    for slots in ([0, -1, 2, 2, 0, -1, 1], [2] * 20 + [-1, 0] * 9, [2], [0, -1]):
        ctx.kernel = "torch"
        ctx.set_token_slots(torch.tensor(slots))
        x, base = (torch.randn(len(slots), n, generator=g).to(dev) for n in (24, 32))
        expected = layer(x, base.clone())
        ctx.kernel = kernel.split("_")[0]
        if kernel == "sgmv_tiles64":  # an eager prefill step's 64-token tiles
            ctx.set_token_slots(torch.tensor(slots), tile_m=64)
            assert ctx.tile_m == 64
        got = layer(x, base.clone())
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        on_base = torch.tensor(slots, device=dev) == -1
        assert torch.equal(got[on_base], base[on_base]) and not torch.allclose(got[0], base[0])
    ctx.active = False
    assert torch.equal(layer(x, base.clone()), base)  # a step without adapters skips the layer
