"""The ragged prefill kernel (the chunk's K/V from the step's k / v through TMA descriptors, the cached prefix
from the paged cache) against its pure-torch reference, and against the paged kernel's reference when the
cache holds the chunk (the engine's case: k / v were just written there). Triton's interpreter on the CPU."""

import pytest
import torch
from _util import assert_rel_close, make_paged_kv, poisoned, rel_tol
from test_paged_prefill_attention import CASES as PAGED_CASES

from kernels.fp8 import dequantize_fp8_ref, quantize_fp8_ref
from kernels.paged_decode_attention import gather_paged_kv
from kernels.paged_prefill_attention import paged_prefill_attention_ref
from kernels.ragged_prefill_attention import (
    DEFAULTS,
    FP8_DEFAULTS,
    OCCUPANCY_TILES,
    SHORT_CHUNK_DEFAULTS,
    SHORT_CHUNK_MAX_Q,
    TILE_CONFIGS,
    WARP_SPECIALIZED_TILES,
    launch_defaults,
    ragged_prefill_attention,
    ragged_prefill_attention_ref,
)


def _chunk_kv(cache, bt, q_lens, ctx):
    """The chunk rows of every sequence, as the step's k (or v) would hold them: [num_tokens, kv_heads, d]."""
    return torch.cat([gather_paged_kv(cache, bt[b], n)[n - ql:] for b, (ql, n) in enumerate(zip(q_lens, ctx))])


def _setup(q_lens, prefixes, hq, hk, d, bs, device, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    ctx = [q + p for q, p in zip(q_lens, prefixes)]
    k_cache, v_cache, bt, lens = make_paged_kv(ctx, hk, d, bs, torch.float32, device, gen=gen)
    k, v = _chunk_kv(k_cache, bt, q_lens, ctx), _chunk_kv(v_cache, bt, q_lens, ctx)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device=device, dtype=dtype)
    return q, k.to(dtype), v.to(dtype), k_cache, v_cache, bt, cu, lens


# the paged kernel's cases (with one more: GQA 8, block_size 32, several query tiles)
CASES = [*PAGED_CASES, ([40, 70], [0, 16], 8, 1, 32, 32, 32, 16)]


@pytest.mark.parametrize("q_lens,prefixes,hq,hk,d,bs,block_m,block_n", CASES)
def test_ragged_prefill_matches_the_paged_reference(device, q_lens, prefixes, hq, hk, d, bs, block_m, block_n):
    """With the chunk in the cache too (as after the KV write), the result is the paged kernel's reference."""
    q, k, v, k_cache, v_cache, bt, cu, lens = _setup(q_lens, prefixes, hq, hk, d, bs, device, sum(q_lens) + hq)
    out = poisoned(q.shape, q.dtype, device)
    ragged_prefill_attention(q, k, v, k_cache, v_cache, bt, cu, lens, d**-0.5, max(q_lens), out=out,
                             block_m=block_m, block_n=block_n)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, bt, cu, lens, d**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))
    assert_rel_close(ragged_prefill_attention_ref(q, k, v, k_cache, v_cache, bt, cu, lens, d**-0.5), ref, 1e-6)


# every swept tile shape, launch order as swept and reversed, and the defaults as the engine runs them
SWEPT = sorted({(bm, bn, rev) for bm, bn, _, _ in TILE_CONFIGS for rev in (False, True)})


SWEPT += [(bm, bn, "warp_specialize") for bm, bn, _, _ in WARP_SPECIALIZED_TILES]  # the WS loop, reversed tiles
SWEPT += sorted({(bm, bn, True) for bm, bn, _, _, _ in OCCUPANCY_TILES} - set(SWEPT))  # the occupancy sweep's shapes


@pytest.mark.parametrize("block_m,block_n,reverse", SWEPT)
def test_every_swept_tile_over_an_fp8_prefix(device, block_m, block_n, reverse):
    """Sequences longer than a 128-row tile, with and without a cached prefix that is not a multiple of any
    tile, the prefix in an FP8 cache (k_scale, v_scale) and the chunk from k / v unquantised: against the
    reference that reads them the same way. A chunk read back from the FP8 cache, or a scale applied to the
    chunk, misses it. "warp_specialize": the chunk loop written for Triton's warp specialisation (the interpreter
    runs it as a plain loop: the same tiles in the same order)."""
    q_lens, prefixes = [137, 9], [0, 150]
    q, k, v, k_cache, v_cache, bt, cu, lens = _setup(q_lens, prefixes, 4, 2, 32, 16, device, block_m + block_n)
    k8, v8 = quantize_fp8_ref(k_cache, 0.01), quantize_fp8_ref(v_cache, 0.02)
    out = poisoned(q.shape, q.dtype, device)
    ws = reverse == "warp_specialize"
    ragged_prefill_attention(q, k, v, k8, v8, bt, cu, lens, 32**-0.5, max(q_lens), out=out, k_scale=0.01,
                             v_scale=0.02, block_m=block_m, block_n=block_n, reverse_tiles=bool(reverse),
                             warp_specialize=ws)
    ref = ragged_prefill_attention_ref(q, k, v, k8, v8, bt, cu, lens, 32**-0.5, k_scale=0.01, v_scale=0.02)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))
    # the chunk really is unquantised: reading it back from the FP8 cache is a measurably different answer
    deq = paged_prefill_attention_ref(q, dequantize_fp8_ref(k8, 0.01), dequantize_fp8_ref(v8, 0.02), bt, cu, lens,
                                      32**-0.5)
    err = ((deq.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err > 10 * rel_tol(torch.float32, device, uses_dot=True), err


@pytest.mark.parametrize("fp8,q_lens", [(False, [300, 130]), (False, [600, 40]), (True, [300, 130])])
def test_the_defaults_match_the_reference(device, fp8, q_lens):
    """No option given: `launch_defaults` (SHORT_CHUNK_DEFAULTS for chunks up to 512 tokens, DEFAULTS past that,
    FP8_DEFAULTS over an FP8 cache), over a prefix and a chunk of several 128-row tiles."""
    prefixes = [0, 70]
    q, k, v, k_cache, v_cache, bt, cu, lens = _setup(q_lens, prefixes, 4, 2, 32, 16, device, 3)
    scales = dict(k_scale=0.01, v_scale=0.02) if fp8 else {}
    if fp8:
        k_cache, v_cache = quantize_fp8_ref(k_cache, 0.01), quantize_fp8_ref(v_cache, 0.02)
    out = poisoned(q.shape, q.dtype, device)
    ragged_prefill_attention(q, k, v, k_cache, v_cache, bt, cu, lens, 32**-0.5, max(q_lens), out=out, **scales)
    ref = ragged_prefill_attention_ref(q, k, v, k_cache, v_cache, bt, cu, lens, 32**-0.5, **scales)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


def test_launch_defaults_follow_the_cache_dtype_and_the_longest_chunk():
    assert launch_defaults(torch.bfloat16, SHORT_CHUNK_MAX_Q) is SHORT_CHUNK_DEFAULTS
    assert launch_defaults(torch.float16, 16) is SHORT_CHUNK_DEFAULTS
    assert launch_defaults(torch.float32, 16) is DEFAULTS  # 128 x 128 fp32 tiles would not fit shared memory
    assert launch_defaults(torch.bfloat16, SHORT_CHUNK_MAX_Q + 1) is DEFAULTS
    assert launch_defaults(torch.float8_e4m3fn, 16) is FP8_DEFAULTS
    assert launch_defaults(torch.float8_e4m3fn, 4096) is FP8_DEFAULTS
    assert SHORT_CHUNK_DEFAULTS["block_m"] == 128 and DEFAULTS["block_m"] == 64 and FP8_DEFAULTS["reverse_tiles"]


def test_strided_k_v_as_the_model_slices_them(device):
    """k / v as views into one fused qkv projection (row stride (hq + 2 hk) * d): read through their strides."""
    q_lens, prefixes, hq, hk, d = [21, 40], [16, 0], 4, 2, 32
    q, k, v, k_cache, v_cache, bt, cu, lens = _setup(q_lens, prefixes, hq, hk, d, 16, device, 9)
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    qs, ks, vs = qkv.split([hq * d, hk * d, hk * d], dim=1)
    qs, ks, vs = qs.view(-1, hq, d), ks.view(-1, hk, d), vs.view(-1, hk, d)
    out = poisoned(q.shape, q.dtype, device)
    ragged_prefill_attention(qs, ks, vs, k_cache, v_cache, bt, cu, lens, d**-0.5, max(q_lens), out=out,
                             block_m=16, block_n=16)
    assert_rel_close(out, paged_prefill_attention_ref(q, k_cache, v_cache, bt, cu, lens, d**-0.5),
                     rel_tol(torch.float32, device, uses_dot=True))


def test_nan_rows_past_the_chunks_change_nothing(device):
    """A CUDA graph's padding rows past the step's tokens hold anything, NaN too, in k / v: the real rows' outputs
    equal the reference (the last tile of a chunk reads rows past it; a masked p of 0 times a NaN V is NaN)."""
    q_lens, prefixes = [5, 7], [0, 16]
    q, k, v, k_cache, v_cache, bt, cu, lens = _setup(q_lens, prefixes, 4, 2, 32, 16, device, 4)
    pad = torch.full((20, 2, 32), float("nan"), device=device)
    qp, kp, vp = torch.cat([q, torch.randn(20, 4, 32, device=device)]), torch.cat([k, pad]), torch.cat([v, pad])
    out = poisoned(qp.shape, qp.dtype, device)
    ragged_prefill_attention(qp, kp, vp, k_cache, v_cache, bt, cu, lens, 32**-0.5, max(q_lens), out=out,
                             block_m=16, block_n=16)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, bt, cu, lens, 32**-0.5)
    assert_rel_close(out[: sum(q_lens)], ref, rel_tol(torch.float32, device, uses_dot=True))


def test_ragged_prefill_rejects_bad_inputs(device):
    q, k, v, k_cache, v_cache, bt, cu, lens = _setup([5], [0], 4, 2, 64, 16, device, 1)
    with pytest.raises(ValueError, match="contiguous heads"):  # (match: the error names the layout it needs)
        gapped = torch.zeros(5, 2, 128, device=device)[..., :64]  # head stride 128: not one TMA row per token
        ragged_prefill_attention(q, gapped, v, k_cache, v_cache, bt, cu, lens, 0.1, 5)
    with pytest.raises(ValueError, match="k"):
        ragged_prefill_attention(q, k[:4], v, k_cache, v_cache, bt, cu, lens, 0.1, 5)
    with pytest.raises(ValueError, match="block_n"):
        ragged_prefill_attention(q, k, v, k_cache, v_cache, bt, cu, lens, 0.1, 5, block_n=48)
    with pytest.raises(ValueError, match="block_n must be <= 256"):
        ragged_prefill_attention(q, k, v, k_cache, v_cache, bt, cu, lens, 0.1, 5, block_n=512)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        ragged_prefill_attention(q, k, v, k_cache, v_cache, bt, cu[:1], lens, 0.1, 5)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hk,bs", [(32, 8, 16), (9, 3, 32)])
def test_ragged_prefill_bf16_real_shapes(hq, hk, bs):
    q_lens, prefixes = [700, 1, 129, 2048, 63, 0], [0, 900, 512, 0, 1000, 300]
    q, k, v, k_cache, v_cache, bt, cu, lens = _setup(q_lens, prefixes, hq, hk, 128, bs, "cuda", 1, torch.bfloat16)
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    out = poisoned(q.shape, q.dtype, "cuda")
    ragged_prefill_attention(q, k, v, k_cache, v_cache, bt, cu, lens, 128**-0.5, max(q_lens), out=out)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, bt, cu, lens, 128**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.bfloat16, "cuda", uses_dot=True))
