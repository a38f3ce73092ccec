"""The segmented (SGMV) LoRA kernels against their pure-torch references (TRITON_INTERPRET=1 on the CPU,
small shapes): tiles from `build_tiles`, mixed ranks, untargeted slices, empty slots, base-model tokens,
segments longer than a tile, fused slices of unequal widths, split-K, and graph-style fixed-size buffers
whose padding rows and unused tiles must be left alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.lora_sgmv import (
    PREFILL_TILE_M,
    TILE_M,
    build_tiles,
    max_tiles,
    sgmv_expand,
    sgmv_expand_ref,
    sgmv_shrink,
    sgmv_shrink_ref,
)
from kernels.lora_sgmv_fused import sgmv_fused


def case(token_slots, in_features, slice_sizes, ranks, dtype, seed=0, device="cpu"):
    """ranks [num_slices][num_slots]: each slot's rank per slice (0: the slice is not targeted)."""
    g = torch.Generator().manual_seed(seed)
    ranks_t = torch.tensor(ranks, dtype=torch.int32)
    num_slices, num_slots = ranks_t.shape
    max_rank = int(ranks_t.max())
    x = torch.randn(len(token_slots), in_features, generator=g).to(device, dtype)
    a = torch.randn(num_slices, num_slots, max_rank, in_features, generator=g).to(device, dtype)
    b = torch.randn(num_slots, max_rank, sum(slice_sizes), generator=g).to(device, dtype)
    return x, a, b, ranks_t.to(device)


def meta(token_slots, num_slots, device, token_cap=None, tile_cap=None, tile_m=TILE_M):
    n = len(token_slots)
    tokens, tiles = build_tiles(np.asarray(token_slots), token_cap or n, tile_cap or max(1, max_tiles(n, num_slots)),
                                tile_m)
    offsets = None
    return torch.from_numpy(tokens).to(device), torch.from_numpy(tiles).to(device), offsets


def offsets_of(slice_sizes, device):
    return torch.tensor(np.cumsum([0, *slice_sizes]), dtype=torch.int32, device=device)


def test_build_tiles_groups_by_slot_and_splits_long_segments():
    slots = np.array([2, -1, 0, 2, 2] + [1] * (TILE_M + 3) + [-1, 0])
    tokens, tiles = build_tiles(slots, 40, 10)
    n_adapter = int((slots >= 0).sum())
    order = tokens[:n_adapter]
    assert sorted(order.tolist()) == np.flatnonzero(slots >= 0).tolist()  # each adapter token exactly once
    assert np.all(np.diff(slots[order]) >= 0)  # grouped by slot, stable within a slot
    used = tiles[0] >= 0
    assert tiles[0, used].tolist() == [0, 1, 1, 2] and np.all(tiles[0, ~used] == -1)
    assert tiles[2, used].tolist() == [2, TILE_M, 3, 3] and tiles[2, used].sum() == n_adapter
    for slot, start, count in tiles[:, used].T:  # every tile's tokens are its slot's
        assert np.all(slots[tokens[start : start + count]] == slot)
    assert int(used.sum()) <= max_tiles(len(slots), 3)
    empty_tokens, empty_tiles = build_tiles(np.full(5, -1), 8, 4)
    assert np.all(empty_tiles[0] == -1) and np.all(empty_tokens == 0)
    with pytest.raises(ValueError, match="tile buffer"):
        build_tiles(slots, 40, 3)


@pytest.mark.parametrize("token_slots,in_features,slice_sizes,ranks", [
    ([0], 64, [48], [[8]]),  # batch-1 decode (split-K over 64 columns)
    ([1, -1, 0, 2, 2, 0, -1], 100, [16, 8, 8], [[4, 16, 8], [4, 0, 8], [4, 16, 0]]),  # q/k/v, untargeted
    ([3] * 37 + [0, -1] * 5, 300, [33, 20], [[2, 8, 16, 1], [2, 8, 16, 1]]),  # a segment of 3 tiles, gate/up
    ([-1, -1, -1], 32, [16], [[16, 16]]),  # base-model tokens only: nothing changes
    ([1, 1, 0, 1, 0], 40, [24], [[16, 80]]),  # rank 80: two rank blocks in shrink and expand
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_expand_match_reference(token_slots, in_features, slice_sizes, ranks, dtype, device):
    x, a, b, ranks_t = case(token_slots, in_features, slice_sizes, ranks, dtype, device=device)
    slots_t = torch.tensor(token_slots, device=device)
    tokens, tiles, _ = meta(token_slots, ranks_t.shape[1], device)
    s = sgmv_shrink(x, a, ranks_t, tokens, tiles)
    ref_s = sgmv_shrink_ref(x, a, ranks_t, slots_t)
    # defined entries: tokens on an adapter, columns below the slot's rank for that slice
    slot_ranks = torch.where(slots_t >= 0, ranks_t[:, slots_t.clamp(min=0)], 0)  # [I, T]
    defined = torch.arange(a.shape[2], device=device)[None, None, :] < slot_ranks[:, :, None]
    torch.testing.assert_close(s[defined], ref_s[defined], rtol=1e-4, atol=1e-3 if dtype == torch.float32 else 0.05)
    y = torch.randn(len(token_slots), sum(slice_sizes)).to(device, dtype)
    before = y.clone()
    expected = sgmv_expand_ref(y, ref_s, b, ranks_t, slots_t, slice_sizes)
    sgmv_expand(y, s, b, ranks_t, tokens, tiles, offsets_of(slice_sizes, device), max(slice_sizes))
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=3e-2, atol=0.5)
    torch.testing.assert_close(y.float(), expected.float(), **tol)
    base = slots_t < 0
    assert torch.equal(y[base], before[base])  # base-model rows are never written
    partials = sgmv_shrink(x, a, ranks_t, tokens, tiles, reduce=False)  # the layers' path: the expand sums them
    y2 = before.clone()
    sgmv_expand(y2, partials, b, ranks_t, tokens, tiles, offsets_of(slice_sizes, device), max(slice_sizes))
    torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 0.02)
    if (slot_ranks > 0).any():
        assert not torch.equal(y, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_tiles_of_64_tokens_equal_tiles_of_16(dtype, device):
    """Eager prefill steps use 64-token tiles: segments of 150 and 70 tokens on two adapters (3 and 2
    tiles, the last ones partial), a few decodes of a third and base tokens; same values as 16-token tiles
    (fp32: to rounding; bf16: the same products, summed in another order)."""
    slots = [0] * 150 + [-1] * 5 + [2] * 3 + [1] * 70 + [-1, 2]
    ranks = [[8, 16, 4], [8, 0, 4]]
    x, a, b, ranks_t = case(slots, 96, [40, 24], ranks, dtype, seed=3, device=device)
    y0 = torch.randn(len(slots), 64).to(device, dtype)
    outs = []
    for tile_m in (TILE_M, PREFILL_TILE_M):
        tokens, tiles, _ = meta(slots, 3, device, tile_m=tile_m)
        assert int((tiles[0] >= 0).sum()) == (10 + 5 + 1 if tile_m == TILE_M else 3 + 2 + 1)
        s = sgmv_shrink(x, a, ranks_t, tokens, tiles, reduce=False, tile_m=tile_m)
        y = y0.clone()
        sgmv_expand(y, s, b, ranks_t, tokens, tiles, offsets_of([40, 24], device), 40, tile_m=tile_m)
        outs.append(y)
    ref_s = sgmv_shrink_ref(x, a, ranks_t, torch.tensor(slots, device=device))
    expected = sgmv_expand_ref(y0, ref_s, b, ranks_t, torch.tensor(slots, device=device), [40, 24])
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=3e-2, atol=0.5)
    torch.testing.assert_close(outs[1].float(), expected.float(), **tol)
    torch.testing.assert_close(outs[1].float(), outs[0].float(), **tol)
    base = torch.tensor(slots, device=device) < 0
    assert torch.equal(outs[1][base], y0[base])
    with pytest.raises(ValueError, match="tile_m"):
        sgmv_shrink(x, a, ranks_t, tokens, tiles, tile_m=32)


@pytest.mark.parametrize("token_slots,ranks", [
    ([1], [[16, 4, 8], [16, 0, 8], [0, 4, 8]]),  # batch 1: q/k/v of unequal ranks, an untargeted slice
    ([2, 0], [[40, 0, 3], [40, 0, 3], [40, 0, 3]]),  # two adapters, rank 40 (three 16-row steps)
    ([-1, 1], [[8, 8], [8, 8], [8, 8]]),  # a base token (left alone) and an adapter token
    ([0], [[0, 8], [0, 8], [0, 8]]),  # an adapter that targets none of the slices: nothing changes
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_equals_shrink_then_expand(token_slots, ranks, dtype, device):
    """`sgmv_fused` (steps of 1-2 tokens, when LORA_FUSED_MAX_TOKENS turns it on) gives what the two kernels
    give, and the reference;
    padded graph buffers (tokens and tiles sized for 16 rows) too."""
    assert len(token_slots) <= 2
    sizes = [24, 8, 8]
    x, a, b, ranks_t = case(token_slots, 300, sizes, ranks, dtype, seed=7, device=device)
    tokens, tiles, _ = meta(token_slots, ranks_t.shape[1], device, token_cap=16, tile_cap=max_tiles(16, 3))
    offsets = offsets_of(sizes, device)
    y0 = torch.randn(len(token_slots), sum(sizes)).to(device, dtype)
    fused = sgmv_fused(y0.clone(), x, a, b, ranks_t, tokens, tiles, offsets, max(sizes))
    two = y0.clone()
    sgmv_expand(two, sgmv_shrink(x, a, ranks_t, tokens, tiles, reduce=False), b, ranks_t, tokens, tiles, offsets,
                max(sizes))
    slots_t = torch.tensor(token_slots, device=device)
    expected = sgmv_expand_ref(y0, sgmv_shrink_ref(x, a, ranks_t, slots_t), b, ranks_t, slots_t, sizes)
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=3e-2, atol=0.5)
    torch.testing.assert_close(fused.float(), expected.float(), **tol)
    torch.testing.assert_close(fused.float(), two.float(), **tol)
    touched = (slots_t >= 0) & (ranks_t.sum(0)[slots_t.clamp(min=0)] > 0)
    assert torch.equal(fused[~touched], y0[~touched])
    assert not touched.any() or not torch.equal(fused[touched], y0[touched])
    with pytest.raises(ValueError, match="shapes disagree"):
        sgmv_fused(y0[:, :8], x, a, b, ranks_t, tokens, tiles, offsets, 8)


def test_graph_style_fixed_buffers_with_padding(device):
    """A graph bucket of 24 rows with 13 real tokens: buffers sized for 64 tokens and every tile a
    bucket of that size may need, padding rows (slot -1) and a stale tail must not be read or written."""
    real = [0, 2, 2, -1, 0, 1, 1, 1, 2, -1, 0, 0, 2]
    bucket = real + [-1] * (24 - len(real))
    slice_sizes, ranks = [16, 8], [[8, 4, 16], [8, 0, 16]]
    x, a, b, ranks_t = case(bucket, 48, slice_sizes, ranks, torch.float32, seed=7, device=device)
    tokens, tiles, _ = meta(bucket, 3, device, token_cap=64, tile_cap=max_tiles(64, 3))
    y = torch.randn(24, 24, device=device)
    expected = sgmv_expand_ref(y, sgmv_shrink_ref(x, a, ranks_t, torch.tensor(bucket)), b, ranks_t,
                               torch.tensor(bucket), slice_sizes)
    sgmv_expand(y, sgmv_shrink(x, a, ranks_t, tokens, tiles), b, ranks_t, tokens, tiles,
                offsets_of(slice_sizes, device), 16)
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-3)
    assert torch.equal(y[len(real):], expected[len(real):])
    # the same buffers refilled for another mix (what a replay sees): the result follows the new slots
    other = [1] * 13 + [-1] * 11
    tokens2, tiles2, _ = meta(other, 3, device, token_cap=64, tile_cap=max_tiles(64, 3))
    tokens.copy_(tokens2)
    tiles.copy_(tiles2)
    y2 = torch.zeros(24, 24, device=device)
    sgmv_expand(y2, sgmv_shrink(x, a, ranks_t, tokens, tiles), b, ranks_t, tokens, tiles,
                offsets_of(slice_sizes, device), 16)
    ref2 = sgmv_expand_ref(torch.zeros(24, 24), sgmv_shrink_ref(x.cpu(), a.cpu(), ranks_t.cpu(), torch.tensor(other)),
                           b.cpu(), ranks_t.cpu(), torch.tensor(other), slice_sizes)
    torch.testing.assert_close(y2.cpu(), ref2, rtol=1e-4, atol=1e-3)


def test_bad_shapes_are_value_errors(device):
    x, a, b, ranks_t = case([0, 1], 32, [16], [[4, 8]], torch.float32, device=device)
    tokens, tiles, _ = meta([0, 1], 2, device)
    with pytest.raises(ValueError, match="in_features"):
        sgmv_shrink(x[:, :30], a, ranks_t, tokens, tiles)
    with pytest.raises(ValueError, match="ranks must have shape"):
        sgmv_shrink(x, a, ranks_t[:, :1], tokens, tiles)
    with pytest.raises(ValueError, match="tiles must have shape"):
        sgmv_shrink(x, a, ranks_t, tokens, tiles[:, :1])
    s = sgmv_shrink(x, a, ranks_t, tokens, tiles)
    with pytest.raises(ValueError, match="offsets"):
        sgmv_expand(torch.zeros(2, 16, device=device), s, b, ranks_t, tokens, tiles, offsets_of([8], device)[:1], 16)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,in_features,slice_sizes,ranks,tile_m", [
    (240, 4096, [4096, 1024, 1024], [16] * 30, TILE_M),  # the benchmark's decode batch: qkv, 30 rank-16 adapters
    (2048, 4096, [14336, 14336], [8, 16, 64] * 10, TILE_M),  # a prefill chunk, gate/up, mixed ranks
    (8192, 4096, [4096, 1024, 1024], [16] * 30, PREFILL_TILE_M),  # the benchmark's eager prefill step, qkv
    (2048, 4096, [14336, 14336], [8, 16, 64] * 10, PREFILL_TILE_M),
    (1, 14336, [4096], [16] * 30, TILE_M),  # batch-1 down_proj (split-K)
    (300, 4096, [4096], [128, 16] * 2, TILE_M),  # ranks over one rank block
    (1, 4096, [4096, 1024, 1024], [16] * 30, "fused"),  # batch-1 qkv: sgmv_fused
    (2, 4096, [4096], [8, 64] * 15, "fused"),  # batch-2 o_proj, two adapters
])
def test_real_shapes_bf16_on_gpu(num_tokens, in_features, slice_sizes, ranks, tile_m):
    """llama-3.1-8b projections in bf16 against an fp32 einsum reference; a fifth of the tokens on the base;
    16-token tiles and the eager prefill steps' 64-token ones."""
    g = torch.Generator().manual_seed(num_tokens)
    num_slots, max_rank, num_slices = len(ranks), max(ranks), len(slice_sizes)
    slots = torch.randint(-1, num_slots, (num_tokens,), generator=g)
    slots[torch.rand(num_tokens, generator=g) < 0.2] = -1
    ranks_t = torch.tensor([ranks] * num_slices, dtype=torch.int32, device="cuda")
    x = torch.randn(num_tokens, in_features, device="cuda").bfloat16()
    a = (torch.randn(num_slices, num_slots, max_rank, in_features, device="cuda") / 8).bfloat16()
    b = (torch.randn(num_slots, max_rank, sum(slice_sizes), device="cuda") / 8).bfloat16()
    fused = tile_m == "fused"
    tile_m = TILE_M if fused else tile_m
    tokens, tiles, _ = meta(slots.tolist(), num_slots, "cuda", tile_m=tile_m)
    y = torch.randn(num_tokens, sum(slice_sizes), device="cuda").bfloat16()
    expected = y.float().clone()
    valid = (slots >= 0).cuda()
    offsets = np.cumsum([0, *slice_sizes])
    s = sgmv_shrink(x, a, ranks_t, tokens, tiles, tile_m=tile_m)
    for slot, rank in enumerate(ranks):  # the reference per slot (a per-token gather of A and B is GBs here)
        rows = (slots == slot).nonzero().flatten().cuda()
        for i in range(num_slices):
            ref_s = x[rows].float() @ a[i, slot, :rank].float().t()  # [n, rank]
            torch.testing.assert_close(s[i][rows][:, :rank], ref_s, rtol=1e-2, atol=0.1)
            lo, hi = offsets[i], offsets[i + 1]
            expected[rows, lo:hi] += ref_s @ b[slot, :rank, lo:hi].float()
    if fused:
        sgmv_fused(y, x, a, b, ranks_t, tokens, tiles, offsets_of(slice_sizes, "cuda"), max(slice_sizes))
    else:
        sgmv_expand(y, s, b, ranks_t, tokens, tiles, offsets_of(slice_sizes, "cuda"), max(slice_sizes), tile_m=tile_m)
    torch.testing.assert_close(y.float(), expected, rtol=3e-2, atol=0.5)
    assert torch.equal(y[~valid].float(), expected[~valid])
