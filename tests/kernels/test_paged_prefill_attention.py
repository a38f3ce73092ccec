import pytest
import torch
from _util import assert_rel_close, make_paged_kv, poisoned, rel_tol

from kernels.fp8 import dequantize_fp8_ref, quantize_fp8_ref
from kernels.paged_prefill_attention import TILE_CONFIGS, paged_prefill_attention, paged_prefill_attention_ref

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


# (block_m, block_n, reverse_tiles, prefetch): every swept tile shape, then the loop options
SWEPT = [(*t, False, False) for t in sorted({c[:2] for c in TILE_CONFIGS})]
SWEPT += [(64, 64, True, False), (16, 32, True, False), (64, 64, False, True), (128, 64, False, True),
          (16, 32, True, True)]


@pytest.mark.parametrize("block_m,block_n,reverse,prefetch", SWEPT)
def test_every_swept_tile_shape_matches_reference(device, block_m, block_n, reverse, prefetch):
    """The bench's tile shapes (TILE_CONFIGS) on sequences longer than a 128-row tile, with and without a
    cached prefix that is not a multiple of any tile, over an FP8 cache, tiles in launch order and reversed
    (longest first), block ids prefetched or not: the H200 sweep times only correct configurations.
    (num_warps / num_stages do not change the result; the interpreter ignores them.)"""
    gen = torch.Generator().manual_seed(block_m + block_n)
    q_lens, prefixes, hq, hk, d, bs = [137, 9], [0, 150], 4, 2, 32, 16
    ctx = [q + p for q, p in zip(q_lens, prefixes)]
    k_cache, v_cache, bt, lens = make_paged_kv(ctx, hk, d, bs, torch.float32, device, gen=gen)
    k8, v8 = quantize_fp8_ref(k_cache, 0.01), quantize_fp8_ref(v_cache, 0.02)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    paged_prefill_attention(q, k8, v8, bt, cu, lens, d**-0.5, max(q_lens), out=out, block_m=block_m,
                            block_n=block_n, k_scale=0.01, v_scale=0.02, reverse_tiles=reverse, prefetch=prefetch)
    ref = paged_prefill_attention_ref(q, dequantize_fp8_ref(k8, 0.01), dequantize_fp8_ref(v8, 0.02), bt, cu, lens,
                                      d**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


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
