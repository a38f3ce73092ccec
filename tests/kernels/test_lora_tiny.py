"""The one-launch tile-free LoRA kernel for steps of a few tokens (kernels/lora_tiny.py) against the SGMV
pure-torch references (TRITON_INTERPRET=1 on the CPU): mixed slots, base-model tokens (slot -1), untargeted
slices (rank 0), ranks below, at and above its 16-row first block, slices of unequal widths that are not
multiples of the column block, in_features that is not a multiple of the K block, both role assignments
(program id, atomic ticket), graph-style fixed buffers (a token-slot buffer longer than the step, repeated
launches on the same counters, which must be left zero), the two-launch mode, and the layer's choice of
the kernel."""

from __future__ import annotations

import pytest
import torch
from _util import assert_rel_close

from kernels.lora_sgmv import sgmv_expand_ref, sgmv_shrink_ref
from kernels.lora_tiny import SYNC_WORDS, lora_tiny, plan

_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def make_case(in_features, slice_sizes, ranks, dtype, device, seed=0):
    """Random A [I, S, R, in] and B [S, R, sum(out)] with rows past each slot's rank zero (the layers'
    invariant), ranks [I, S] int32 (0: the slice is not targeted)."""
    g = torch.Generator().manual_seed(seed)
    ranks_t = torch.tensor(ranks, dtype=torch.int32)
    num_slices, num_slots = ranks_t.shape
    max_rank = int(ranks_t.max())
    a = torch.randn(num_slices, num_slots, max_rank, in_features, generator=g) / in_features**0.5
    b = torch.randn(num_slots, max_rank, sum(slice_sizes), generator=g)
    offsets = [0]
    for size in slice_sizes:
        offsets.append(offsets[-1] + size)
    for i in range(num_slices):
        for s in range(num_slots):
            r = int(ranks_t[i, s])
            a[i, s, r:] = 0
            b[s, r:, offsets[i] : offsets[i + 1]] = 0
    return a.to(device, dtype), b.to(device, dtype), ranks_t.to(device), g


def reference(y, x, a, b, ranks, slots, slice_sizes):
    s = sgmv_shrink_ref(x, a, ranks, slots)
    return sgmv_expand_ref(y, s, b, ranks, slots, slice_sizes)


# (in_features, slice sizes, ranks [slices][slots]): qkv-like with an untargeted k in slot 1, ranks 3/16/24
# (24: a second rank block), an empty slot 3; a single o-like slice; two slices (gate/up-like)
CASES = [
    (300, [200, 72, 72], [[16, 3, 24, 0], [16, 0, 24, 0], [16, 3, 24, 0]]),
    (128, [130], [[8, 16, 40]]),
    (96, [64, 160], [[4, 0], [4, 20]]),
]


MODES = {"pid": dict(ticket=False, two_launches=False), "ticket": dict(ticket=True, two_launches=False),
         "two": dict(two_launches=True)}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("slots", [[0], [2], [-1], [1, -1, 2, 0, 2], [3, 0, -1, 1, 1, 2, -1, 0]])
def test_tiny_matches_reference(case, slots, mode, device):
    in_features, sizes, ranks = CASES[case]
    num_slots = len(ranks[0])
    slots = [s % num_slots if s >= 0 else -1 for s in slots]
    a, b, ranks_t, g = make_case(in_features, sizes, ranks, torch.float32, device, seed=case)
    x = torch.randn(len(slots), in_features, generator=g).to(device)
    y0 = torch.randn(len(slots), sum(sizes), generator=g).to(device)
    # the graph layout: the step's rows first, then padding rows (-1) up to the buffer's size
    token_slots = torch.tensor(slots + [-1] * 5, dtype=torch.int32, device=device)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int32, device=device)
    expected = reference(y0, x, a, b, ranks_t, token_slots[: len(slots)].cpu(), sizes)
    for _ in range(2):  # the second launch reuses the counters: the first must have left them zero
        y = y0.clone()
        got = lora_tiny(y, x, a, b, ranks_t, token_slots, sizes, sync, **MODES[mode])
        assert got is y
        assert torch.equal(sync.cpu(), torch.zeros(SYNC_WORDS, dtype=torch.int32))
        assert_rel_close(y.cpu(), expected.cpu(), _TOL[torch.float32])
        base_rows = [t for t, s in enumerate(slots) if s < 0]
        assert torch.equal(y[base_rows], y0[base_rows])  # base-model rows untouched, bit for bit
        for t, s in enumerate(slots):  # a row whose slot has a rank somewhere moved
            if s >= 0 and any(r[s] for r in ranks):
                assert not torch.equal(y[t], y0[t])


def test_tiny_bf16_matches_reference(device):
    in_features, sizes, ranks = CASES[0]
    a, b, ranks_t, g = make_case(in_features, sizes, ranks, torch.bfloat16, device, seed=3)
    slots = [2, 0, -1]
    x = torch.randn(len(slots), in_features, generator=g).to(device, torch.bfloat16)
    y = torch.randn(len(slots), sum(sizes), generator=g).to(device, torch.bfloat16)
    token_slots = torch.tensor(slots, dtype=torch.int32, device=device)
    expected = reference(y, x, a, b, ranks_t, token_slots.cpu(), sizes)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int32, device=device)
    lora_tiny(y, x, a, b, ranks_t, token_slots, sizes, sync)
    assert_rel_close(y.float().cpu(), expected.float().cpu(), _TOL[torch.bfloat16])


def test_plan_covers_in_features_and_columns():
    for num_tokens, in_features, sizes in [(1, 4096, [4096, 1024, 1024]), (1, 4096, [4096]), (8, 14336, [4096]),
                                           (3, 300, [200, 72, 72])]:
        p = plan(num_tokens, in_features, sizes)
        assert p["splits"] * p["k_chunk"] >= in_features  # every K column in some split
        assert p["splits"] <= -(-in_features // 64)  # no more splits than 64-column K blocks
        assert p["splits"] & (p["splits"] - 1) == 0  # a power of two (the expand's [splits, 16] partial block)
        assert p["num_shrink"] == num_tokens * len(sizes) * p["splits"]
        assert p["num_expand"] == num_tokens * sum(-(-s // 128) for s in sizes)
    p = plan(1, 4096, [4096, 1024, 1024])  # batch-1 qkv at llama-3.1-8b: 48 shrinks of 256 columns, 48 expands
    assert (p["splits"], p["k_chunk"], p["num_shrink"], p["num_expand"]) == (16, 256, 48, 48)


def test_tiny_rejects_bad_arguments(device):
    a, b, ranks_t, _ = make_case(64, [16] * 3, [[4]] * 3, torch.float32, device)
    x, y = torch.zeros(1, 64, device=device), torch.zeros(1, 48, device=device)
    slots = torch.zeros(1, dtype=torch.int32, device=device)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="slices"):
        lora_tiny(y, x, a, b, ranks_t, slots, [16, 32], sync)
    with pytest.raises(ValueError, match="sync"):
        lora_tiny(y, x, a, b, ranks_t, slots, [16] * 3, sync[:2])
    a4 = torch.zeros(4, 1, 4, 64, device=device)
    with pytest.raises(ValueError, match="slices"):
        lora_tiny(torch.zeros(1, 64, device=device), x, a4, torch.zeros(1, 4, 64, device=device),
                  torch.zeros(4, 1, dtype=torch.int32, device=device), slots, [16] * 4, sync)


def test_layer_takes_tiny_kernel_up_to_threshold(device, monkeypatch):
    import kernels.lora_tiny as tiny
    from shared_engine.model_executor.layers.lora import LoRAContext, LoRAProjection

    g = torch.Generator().manual_seed(11)
    dev = torch.device(device)
    ctx = LoRAContext(max_num_tokens=32, max_loras=3, dtype=torch.float32, device=dev)
    sizes = [160, 40, 40]
    layer = LoRAProjection(ctx, 72, sizes, max_rank=32, dtype=torch.float32, device=dev, group="qkv")
    for slot, rank in [(0, 8), (2, 20)]:  # slot 1 empty; slot 2 does not target k
        for i, size in enumerate(sizes):
            if (slot, i) != (2, 1):
                layer.write_slot(slot, i, torch.randn(rank, 72, generator=g).to(dev),
                                 torch.randn(size, rank, generator=g).to(dev))
    layer.write_slot(0, 0, torch.randn(4, 72, generator=g).to(dev), torch.randn(160, 4, generator=g).to(dev))
    calls = []
    real = tiny.lora_tiny
    monkeypatch.setattr(tiny, "lora_tiny", lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k))
    ctx.active = True
    weight = torch.randn(sum(sizes), 72, generator=g).to(dev)
    for threshold, slots in [(4, [2]), (4, [0, -1, 2, 1]), (4, [0, -1, 2, 2, 0]), (0, [2])]:
        monkeypatch.setattr(tiny, "TINY_MAX_TOKENS", threshold)
        ctx.kernel = "torch"
        ctx.set_token_slots(torch.tensor(slots))
        x = torch.randn(len(slots), 72, generator=g).to(dev)
        expected = layer(x, x @ weight.t())
        ctx.kernel = "sgmv"
        ctx.set_token_slots(torch.tensor(slots))
        calls.clear()
        got = layer.apply(x, lambda v: v @ weight.t())
        assert calls == ([len(slots)] if len(slots) <= threshold else []), (threshold, slots, calls)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(got, x @ weight.t())
        assert torch.equal(ctx.tiny_sync.cpu(), torch.zeros(4, dtype=torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the counters' ordering needs concurrent programs (GPU)")
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("num_tokens", [1, 8])
def test_tiny_llama_qkv_replays_in_cuda_graph(num_tokens, mode):
    """llama-3.1-8b's qkv (4096 -> 4096 + 1024 + 1024) in bf16, 32 slots of max rank 64 (30 of rank 16, slot
    31 of rank 64), captured once and replayed with new slots and inputs: every replay equals the reference
    (a missing wait or a stale counter shows up as a wrong or hung replay)."""
    dev = torch.device("cuda")
    sizes = [4096, 1024, 1024]
    ranks = [[16] * 30 + [0, 64] for _ in sizes]
    a, b, ranks_t, g = make_case(4096, sizes, ranks, torch.bfloat16, dev, seed=7)
    x_static = torch.zeros(num_tokens, 4096, device=dev, dtype=torch.bfloat16)
    y_static = torch.zeros(num_tokens, sum(sizes), device=dev, dtype=torch.bfloat16)
    y_in = torch.zeros_like(y_static)
    token_slots = torch.full((16,), -1, dtype=torch.int32, device=dev)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int32, device=dev)
    lora_tiny(y_static, x_static, a, b, ranks_t, token_slots, sizes, sync, **MODES[mode])  # JIT outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static.copy_(y_in)
        lora_tiny(y_static, x_static, a, b, ranks_t, token_slots, sizes, sync, **MODES[mode])
    for step in range(20):
        slots = torch.randint(-1, 32, (num_tokens,), generator=g, dtype=torch.int32)
        slots[0] = 31 if step % 2 else 0
        x_static.copy_(torch.randn(num_tokens, 4096, generator=g).to(dev, torch.bfloat16))
        y_in.copy_(torch.randn(num_tokens, sum(sizes), generator=g).to(dev, torch.bfloat16))
        token_slots[:num_tokens].copy_(slots.to(dev))
        graph.replay()
        expected = reference(y_in, x_static, a, b, ranks_t, slots, sizes)
        torch.cuda.synchronize()
        assert_rel_close(y_static.float(), expected.float(), _TOL[torch.bfloat16])
        assert torch.equal(sync.cpu(), torch.zeros(SYNC_WORDS, dtype=torch.int32))
