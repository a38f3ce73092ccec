import pytest
import torch
from _util import assert_rel_close, make_paged_kv, poisoned, rel_tol

from kernels.fp8 import dequantize_fp8_ref, quantize_fp8_ref
from kernels.paged_decode_attention import gather_paged_kv
from kernels.paged_prefill_attention import (
    DEFAULTS,
    FP8_DEFAULTS,
    TILE_CONFIGS,
    paged_prefill_attention,
    paged_prefill_attention_ref,
)

# (q_lens, cached prefix lens, num_q_heads, num_kv_heads, head_dim, block_size, block_m, block_n)
CASES = [
    ([5, 16, 1], [0, 0, 0], 4, 4, 64, 16, 16, 16),  # plain prefill, GQA 1
    ([17, 3], [15, 32], 8, 4, 64, 32, 16, 32),  # chunked prefill over a cached prefix, GQA 2
    ([33, 1], [7, 40], 8, 2, 128, 16, 16, 16),  # GQA 4, head_dim 128, a decode-like row
    ([20, 9], [0, 17], 9, 3, 32, 16, 16, 32),  # GQA 3 (SmolLM2)
    ([17, 0, 3], [15, 9, 32], 4, 2, 64, 32, 32, 32),  # chunks start mid-block / on a block; an empty sequence
    ([19, 4], [0, 37], 8, 2, 64, 16, 16, 32),  # block_n wider than block_m
    ([6, 11], [16, 0], 8, 1, 64, 32, 32, 16),  # GQA 8, block_size 32
]


def _run_case(device, dtype, q_lens, prefixes, hq, hk, d, bs, block_m, block_n, gen):
    ctx = [q + p for q, p in zip(q_lens, prefixes)]
    k_cache, v_cache, bt, lens = make_paged_kv(ctx, hk, d, bs, dtype, device, gen=gen)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device=device, dtype=dtype)
    out = poisoned(q.shape, dtype, device)
    kw = dict(block_m=block_m, block_n=block_n) if block_m else {}
    paged_prefill_attention(q, k_cache, v_cache, bt, cu, lens, d**-0.5, max(q_lens), out=out, **kw)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, bt, cu, lens, d**-0.5)
    assert_rel_close(out, ref, rel_tol(dtype, device, uses_dot=True))


@pytest.mark.parametrize("q_lens,prefixes,hq,hk,d,bs,block_m,block_n", CASES)
def test_prefill_matches_reference(device, q_lens, prefixes, hq, hk, d, bs, block_m, block_n):
    gen = torch.Generator().manual_seed(sum(q_lens) * 131 + hq)
    _run_case(device, torch.float32, q_lens, prefixes, hq, hk, d, bs, block_m, block_n, gen)


# (block_m, block_n, reverse_tiles, prefetch, lazy_rescale): every swept tile shape, then the loop options
SWEPT = [(*t, False, False, False) for t in sorted({c[:2] for c in TILE_CONFIGS})]
SWEPT += [(64, 64, True, False, False), (16, 32, True, False, False), (64, 64, False, True, False),
          (128, 64, False, True, False), (16, 32, True, True, False), (64, 64, False, True, True),
          (128, 128, False, True, True), (16, 32, True, False, True), (32, 16, False, True, True)]
# the launcher's defaults as they run (FP8_DEFAULTS: 64 x 128 tiles, reverse order, no prefetch; the 9a99c62 sweep)
SWEPT += [t for t in dict.fromkeys(
    (c["block_m"], c["block_n"], c["reverse_tiles"], c["prefetch"], c["lazy_rescale"]) for c in (DEFAULTS, FP8_DEFAULTS)
) if t not in SWEPT]


def _fp8_two_sequences_case(device, seed: int, **options) -> None:
    """Sequences longer than a 128-row tile, with and without a cached prefix that is not a multiple of any
    tile, over an FP8 cache: the kernel with `options` (none: the launcher's defaults) against the reference."""
    gen = torch.Generator().manual_seed(seed)
    q_lens, prefixes, hq, hk, d, bs = [137, 9], [0, 150], 4, 2, 32, 16
    ctx = [q + p for q, p in zip(q_lens, prefixes)]
    k_cache, v_cache, bt, lens = make_paged_kv(ctx, hk, d, bs, torch.float32, device, gen=gen)
    k8, v8 = quantize_fp8_ref(k_cache, 0.01), quantize_fp8_ref(v_cache, 0.02)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    paged_prefill_attention(q, k8, v8, bt, cu, lens, d**-0.5, max(q_lens), out=out, k_scale=0.01, v_scale=0.02,
                            **options)
    ref = paged_prefill_attention_ref(q, dequantize_fp8_ref(k8, 0.01), dequantize_fp8_ref(v8, 0.02), bt, cu, lens,
                                      d**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


@pytest.mark.parametrize("block_m,block_n,reverse,prefetch,lazy", SWEPT)
def test_every_swept_tile_shape_matches_reference(device, block_m, block_n, reverse, prefetch, lazy):
    """The bench's tile shapes (TILE_CONFIGS) over an FP8 cache, tiles in launch order and reversed (longest
    first), block ids prefetched or not, lazy rescaling or not: the H200 sweep times only correct
    configurations. (num_warps / num_stages do not change the result; the interpreter ignores them.)"""
    _fp8_two_sequences_case(device, block_m + block_n, block_m=block_m, block_n=block_n, reverse_tiles=reverse,
                            prefetch=prefetch, lazy_rescale=lazy)


def test_fp8_cache_with_the_launchers_defaults_matches_reference(device):
    """No tile or loop option given over an FP8 cache: FP8_DEFAULTS (reverse_tiles included) as the engine runs them."""
    _fp8_two_sequences_case(device, 5)


def _scale_keys_by_position(k_cache, bt, ctx, bs, steps):
    """K of token p of each sequence times factor f for every (start, f) of `steps` with p >= start (the last
    such): the scores, and each row's running max, jump at the starts."""
    for b, n in enumerate(ctx):
        for p in range(n):
            f = [f for start, f in steps if p >= start]
            k_cache[int(bt[b, p // bs]), p % bs] *= f[-1] if f else 1.0


@pytest.mark.parametrize("prefetch", [False, True])
def test_lazy_rescale_matches_reference_when_the_max_grows(device, prefetch):
    """lazy_rescale keeps a stale row max until some row's max grows by more than RESCALE_THRESHOLD (log2
    units): keys scaled up 40x and then 80x along the sequence make later full tiles both skip the rescale
    (growth <= 8) and need it (growth > 128: without it exp2 overflows fp32), as asserted on the data first; a
    missing or wrong rescale of acc or l_i fails the comparison."""
    gen = torch.Generator().manual_seed(7)
    q_lens, prefixes, hq, hk, d, bs, bm, bn = [150, 40], [0, 90], 4, 2, 32, 16, 16, 16
    ctx = [q + p for q, p in zip(q_lens, prefixes)]
    k_cache, v_cache, bt, lens = make_paged_kv(ctx, hk, d, bs, torch.float32, device, gen=gen)
    _scale_keys_by_position(k_cache, bt, ctx, bs, [(48, 40.0), (96, 80.0)])
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    q = (3 * torch.randn(sum(q_lens), hq, d, generator=gen)).to(device)
    scale = d**-0.5
    # the data exercises both branches: per 16-key tile growth of the last query's running max (log2 units)
    keys = gather_paged_kv(k_cache, bt[0], ctx[0]).float()  # [n, hk, d]
    s = torch.einsum("hd,nhd->hn", q[q_lens[0] - 1, ::hq // hk].float(), keys) * scale * 1.4426950408889634
    full = ctx[0] // bn * bn
    tile_max = s[:, :full].view(hk, -1, bn).amax(-1).cummax(-1).values  # [hk, tiles], running max
    growth = (tile_max[:, 1:] - tile_max[:, :-1]).amax(0)  # per tile, over the heads
    assert (growth > 128).any() and ((growth > 0) & (growth <= 8)).any(), growth
    out = poisoned(q.shape, q.dtype, device)
    paged_prefill_attention(q, k_cache, v_cache, bt, cu, lens, scale, max(q_lens), out=out, block_m=bm, block_n=bn,
                            prefetch=prefetch, lazy_rescale=True)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, bt, cu, lens, scale)
    # CUDA: fp32 dots run in tf32, whose error grows with these logits (4.2e-3 on an H100 at dc8ddbd, with lazy
    # rescaling and without); a missing or wrong rescale misses by orders of magnitude
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True) if device == "cpu" else 1e-2)


# Triton's CPU interpreter (3.9) computes bf16 tl.dot wrongly (errors ~1e10 on a 16 x 16 product): bf16 dots on CUDA
@pytest.mark.parametrize("fp8_f16", [pytest.param(False, marks=pytest.mark.gpu), True])
def test_bf16_q_over_fp8_cache_matches_reference(device, fp8_f16):
    """bf16 q over an FP8 cache, with the dots in bf16 (fp8_f16=False) or in fp16 (True: q cast to fp16, the
    e4m3 tiles cast exactly, P in fp16), against the fp32 reference over the dequantised cache, within bf16's
    tolerance (4e-3 for fp16 dots: a 1% error in q's cast misses it); wrong scales or casts miss by far more."""
    gen = torch.Generator().manual_seed(11)
    q_lens, prefixes, hq, hk, d, bs = [70, 5], [0, 33], 4, 2, 32, 16
    ctx = [q + p for q, p in zip(q_lens, prefixes)]
    k_cache, v_cache, bt, lens = make_paged_kv(ctx, hk, d, bs, torch.float32, device, gen=gen)
    k8, v8 = quantize_fp8_ref(k_cache, 0.01), quantize_fp8_ref(v_cache, 0.02)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = poisoned(q.shape, q.dtype, device)
    paged_prefill_attention(q, k8, v8, bt, cu, lens, d**-0.5, max(q_lens), out=out, block_m=32, block_n=16,
                            k_scale=0.01, v_scale=0.02, fp8_f16=fp8_f16)
    ref = paged_prefill_attention_ref(q.float(), dequantize_fp8_ref(k8, 0.01), dequantize_fp8_ref(v8, 0.02), bt, cu,
                                      lens, d**-0.5)
    # fp16 dots: q and the tiles cast exactly, only P's fp16 and the output's bf16 rounding remain
    assert_rel_close(out.float(), ref, 4e-3 if fp8_f16 else rel_tol(torch.bfloat16, device, uses_dot=True))


def test_prefill_rejects_bad_inputs(device):
    k_cache, v_cache, bt, lens = make_paged_kv([5], 2, 64, 16, torch.float32, device)
    q = torch.randn(5, 4, 64, device=device)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        paged_prefill_attention(q, k_cache, v_cache, bt, cu.long(), lens, 0.1, 5)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        paged_prefill_attention(q, k_cache, v_cache, bt, cu[:1], lens, 0.1, 5)
    with pytest.raises(ValueError, match="stride 1"):
        paged_prefill_attention(
            q.transpose(1, 2).contiguous().transpose(1, 2), k_cache, v_cache, bt, cu, lens, 0.1, 5
        )
    with pytest.raises(ValueError, match="block_m"):
        paged_prefill_attention(q, k_cache, v_cache, bt, cu, lens, 0.1, 5, block_m=48)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hk,bs", [(32, 8, 16), (9, 3, 32), (16, 16, 16)])
def test_prefill_bf16_real_shapes(hq, hk, bs):
    gen = torch.Generator().manual_seed(1)
    q_lens = [700, 1, 129, 2048, 63, 0]
    prefixes = [0, 900, 512, 0, 1000, 300]
    _run_case("cuda", torch.bfloat16, q_lens, prefixes, hq, hk, 128, bs, None, None, gen)
