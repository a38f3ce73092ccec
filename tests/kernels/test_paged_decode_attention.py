import pytest
import torch
from _util import assert_rel_close, make_paged_kv, poisoned, rel_tol

from kernels.paged_decode_attention import (
    MAX_SPLITS,
    choose_num_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
)

# (context_lens, num_q_heads, num_kv_heads, head_dim, block_size, num_splits)
CASES = [
    ([1, 16, 37], 4, 4, 64, 16, None),  # GQA 1, lengths on/off block boundaries
    ([33, 64, 5], 8, 4, 64, 32, 2),  # GQA 2
    ([100, 17], 8, 2, 128, 16, 3),  # GQA 4, head_dim 128, split-K
    ([47, 96, 2], 9, 3, 64, 16, 4),  # GQA 3 (SmolLM2), one split shorter than the others
    ([129, 31], 4, 1, 32, 32, 1),  # MQA, head_dim 32
    ([3], 2, 2, 16, 16, 8),  # more splits than tokens: empty splits must not produce NaN
    ([700, 1], 8, 2, 64, 16, 130),  # more splits than one reduce tile (64): most of them empty
    ([1000], 4, 1, 128, 16, 200),  # 200 splits, 16 of them non-empty
    ([16500, 3], 4, 1, 32, 16, 300),  # past one reduce tile (256): 258 non-empty splits, the online rescale
]


@pytest.mark.parametrize("context_lens,hq,hk,d,bs,splits", CASES)
def test_decode_matches_reference(device, context_lens, hq, hk, d, bs, splits):
    gen = torch.Generator().manual_seed(hash((tuple(context_lens), hq, d)) % 2**31)
    k_cache, v_cache, bt, lens = make_paged_kv(context_lens, hk, d, bs, torch.float32, device, gen=gen)
    q = torch.randn(len(context_lens), hq, d, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    paged_decode_attention(q, k_cache, v_cache, bt, lens, d**-0.5, out=out, num_splits=splits)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, d**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


# (context_lens, num_q_heads, num_kv_heads, num_splits, reduce_tile): the two merge paths and the fused
# merge's rounds of loads (splits > reduce_tile), GQA 3 (a padded head row), empty splits and contexts.
MERGE_CASES = [
    ([100, 17], 8, 2, 3, 32),
    ([47, 0, 96], 9, 3, 7, 2),  # 4 rounds of 2 splits; an empty context gives zeros
    ([700, 1], 8, 2, 130, 16),  # 9 rounds, most splits empty
    ([90], 2, 2, 4, 4),  # GQA 1 (a padded head row)
]


@pytest.mark.parametrize("fuse,interleave,merge_2d", [(True, False, False), (False, False, False),
                                                      (True, True, False), (True, False, True)])
@pytest.mark.parametrize("context_lens,hq,hk,splits,tile", MERGE_CASES)
def test_fused_and_two_kernel_merges_match_reference(device, fuse, interleave, merge_2d, context_lens, hq, hk,
                                                     splits, tile):
    gen = torch.Generator().manual_seed(len(context_lens) * 31 + splits)
    k_cache, v_cache, bt, lens = make_paged_kv(context_lens, hk, 64, 16, torch.float32, device, gen=gen)
    q = torch.randn(len(context_lens), hq, 64, generator=gen).to(device)
    counters = torch.zeros(len(context_lens) * hk + 5, dtype=torch.int32, device=device)
    out = poisoned(q.shape, q.dtype, device)
    paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.125, out=out, num_splits=splits,
                           fuse_reduce=fuse, reduce_tile=tile, counters=counters, interleave=interleave,
                           merge_2d=merge_2d)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)
    ref = torch.where(lens[:, None, None] > 0, ref, 0.0)  # the reference's softmax over no tokens is NaN
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))
    # The fused merge hands the counters back at zero (what the next launch or graph replay needs), and the
    # two-kernel path never touches them.
    assert counters.tolist() == [0] * counters.numel()


@pytest.mark.parametrize("fuse,interleave", [(True, False), (False, False), (True, True)])
def test_min_split_tokens_splits_each_context_by_its_length(device, fuse, interleave):
    """16 programs per sequence, one active split per 128 tokens of each context (6, 1, 1, 3): the
    inactive programs read nothing and the merge skips them; equal to the reference either way."""
    gen = torch.Generator().manual_seed(5)
    lens_list = [700, 50, 0, 257]
    k_cache, v_cache, bt, lens = make_paged_kv(lens_list, 2, 32, 16, torch.float32, device, gen=gen)
    q = torch.randn(4, 4, 32, generator=gen).to(device)
    counters = torch.zeros(8, dtype=torch.int32, device=device)
    out = poisoned(q.shape, q.dtype, device)
    paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.2, out=out, num_splits=16, block_n=32,
                           fuse_reduce=fuse, interleave=interleave, min_split_tokens=128, counters=counters)
    ref = torch.where(lens[:, None, None] > 0, paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.2), 0.0)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))
    assert counters.tolist() == [0] * 8
    with pytest.raises(ValueError, match="min_split_tokens"):
        paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.2, num_splits=16, min_split_tokens=0)


def test_fused_merge_counts_every_split(device):
    """A counter left at 1 makes the second-to-last program merge (one partial missing, the output off) and
    the buffer comes back non-zero: the reset at the end of each launch is what keeps replays right. (The
    interpreter runs the programs in order; on a GPU which program merges early is a race, so only the
    clean launches are checked there.)"""
    k_cache, v_cache, bt, lens = make_paged_kv([300], 1, 32, 16, torch.float32, device)
    q = torch.randn(1, 2, 32, device=device)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.2)
    counters = torch.zeros(1, dtype=torch.int32, device=device)
    for _ in range(2):  # twice on one buffer: a launch leaves it ready for the next
        out = paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.2, num_splits=5, counters=counters,
                                     fuse_reduce=True)
        assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))
        assert counters.item() == 0
    if device == "cuda":
        return
    counters.fill_(1)
    q2 = torch.randn_like(q)  # a new query: a partial left over from the calls above would be wrong for it
    out = paged_decode_attention(q2, k_cache, v_cache, bt, lens, 0.2, num_splits=5, counters=counters,
                                 fuse_reduce=True)
    assert counters.item() == 1
    ref2 = paged_decode_attention_ref(q2, k_cache, v_cache, bt, lens, 0.2)
    assert not torch.allclose(out, ref2, rtol=1e-3, atol=1e-3)


def test_fused_merge_rejects_bad_counters(device):
    k_cache, v_cache, bt, lens = make_paged_kv([40, 9], 2, 32, 16, torch.float32, device)
    q = torch.randn(2, 4, 32, device=device)
    with pytest.raises(ValueError, match="counters must hold >= 4"):
        paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.1, num_splits=2, fuse_reduce=True,
                               counters=torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="counters must have dtype"):
        paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.1, num_splits=2, fuse_reduce=True,
                               counters=torch.zeros(4, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="reduce_tile"):
        paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.1, num_splits=2, reduce_tile=24)


def test_decode_fp16_strided_q(device):
    gen = torch.Generator().manual_seed(7)
    k_cache, v_cache, bt, lens = make_paged_kv([40, 9], 2, 64, 16, torch.float16, device, gen=gen)
    qkv = torch.randn(2, 12, 64, generator=gen).to(device=device, dtype=torch.float16)
    q = qkv[:, :8]  # a view of a fused qkv tensor: strided over tokens
    out = paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.125, num_splits=2)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)
    assert_rel_close(out, ref, rel_tol(torch.float16, device))


def test_choose_num_splits_depends_on_ints_only():
    assert choose_num_splits(64, 8, 16384) >= 1
    assert choose_num_splits(1, 8, 16384) > choose_num_splits(1, 8, 1024)
    assert choose_num_splits(1, 8, 100) == 1


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
@pytest.mark.parametrize("context", [16384, 32768, 65536, 131072])
def test_small_batch_long_context_fills_the_sms(batch, context):
    """Batch 1-4 x 8 kv heads at 16k-128k tokens on 132 SMs: about 8 programs per SM (>= 7.7), splits of
    >= 128 tokens; a batch that already fills the SMs keeps about two (batch 64 at 16k: unsplit)."""
    splits = choose_num_splits(batch, 8, context, 132)
    assert batch * 8 * splits >= 1016 and context // splits >= 128 and splits <= MAX_SPLITS
    assert choose_num_splits(1, 8, 16384, 132) == 128 and choose_num_splits(1, 8, 131072, 132) == 132
    assert choose_num_splits(64, 8, 16384, 132) == 1 and choose_num_splits(32, 8, 16384, 132) == 2


def test_heuristic_splits_at_long_context_match_reference(device):
    """The launcher's own split count (max_context_len as a CUDA graph passes it: longer than the contexts)."""
    gen = torch.Generator().manual_seed(11)
    k_cache, v_cache, bt, lens = make_paged_kv([4096, 2999], 2, 64, 16, torch.float32, device, gen=gen)
    q = torch.randn(2, 8, 64, generator=gen).to(device)
    assert choose_num_splits(2, 2, 8192, 132) == 64
    out = poisoned(q.shape, q.dtype, device)
    paged_decode_attention(q, k_cache, v_cache, bt, lens, 0.125, out=out, max_context_len=8192)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


def test_decode_rejects_bad_inputs(device):
    k_cache, v_cache, bt, lens = make_paged_kv([5], 2, 64, 16, torch.float32, device)
    q = torch.randn(1, 4, 64, device=device)
    with pytest.raises(ValueError, match="context_lens"):
        paged_decode_attention(q, k_cache, v_cache, bt, lens.long(), 0.1)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(torch.randn(1, 3, 64, device=device), k_cache, v_cache, bt, lens, 0.1)
    with pytest.raises(ValueError, match="contiguous"):
        paged_decode_attention(q, k_cache.transpose(0, 1), v_cache, bt, lens, 0.1)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_decode_attention(q.half(), k_cache, v_cache, bt, lens, 0.1)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(
            q[..., :48], k_cache[..., :48].contiguous(), v_cache[..., :48].contiguous(), bt, lens, 0.1
        )


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hk,bs", [(32, 8, 16), (32, 8, 32), (9, 3, 16), (16, 16, 16)])
@pytest.mark.parametrize("splits", [None, 1, 5])
@pytest.mark.parametrize("fuse", [False, True])
def test_decode_bf16_real_shapes(hq, hk, bs, splits, fuse):
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 3000, (24,), generator=gen).tolist() + [4096, 1]
    k_cache, v_cache, bt, lens_t = make_paged_kv(lens, hk, 128, bs, torch.bfloat16, "cuda", gen=gen)
    q = torch.randn(len(lens), hq, 128, generator=gen).to("cuda", torch.bfloat16)
    out = poisoned(q.shape, q.dtype, "cuda")
    paged_decode_attention(q, k_cache, v_cache, bt, lens_t, 128**-0.5, out=out, num_splits=splits, fuse_reduce=fuse)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens_t, 128**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.bfloat16, "cuda"))


def _has_pdl() -> bool:
    import triton.language.extra.cuda as tl_cuda

    return hasattr(tl_cuda, "gdc_wait")


@pytest.mark.gpu
@pytest.mark.parametrize("fuse,interleave,merge_2d,pdl", [
    (True, False, False, False), (False, False, False, False), (True, True, False, False),
    (True, False, True, False), (False, False, False, True), (True, False, False, True)])
def test_decode_cuda_graph_replay(fuse, interleave, merge_2d, pdl):
    if pdl and not _has_pdl():
        pytest.skip("this Triton has no programmatic dependent launch (gdc_wait)")
    """Captured once, replayed with new queries and lengths: equal to the reference each time (the fused
    merge's counters come back to zero inside the graph, no host reset)."""
    lens = [700, 3, 2049, 128]
    k_cache, v_cache, bt, lens_t = make_paged_kv(lens, 8, 128, 16, torch.bfloat16, "cuda")
    q = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    max_len = bt.shape[1] * 16
    kw = dict(out=out, max_context_len=max_len, fuse_reduce=fuse, interleave=interleave, merge_2d=merge_2d,
              pdl=pdl)
    paged_decode_attention(q, k_cache, v_cache, bt, lens_t, 0.088, **kw)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, k_cache, v_cache, bt, lens_t, 0.088, **kw)
    for step in range(3):
        q.copy_(torch.randn_like(q))
        lens_t.copy_(torch.tensor([701 + step, 4, 2050, 129 + 500 * step], dtype=torch.int32))
        graph.replay()
        ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens_t, 0.088)
        assert_rel_close(out, ref, rel_tol(torch.bfloat16, "cuda"))


@pytest.mark.gpu
def test_fused_merge_many_launches_bf16():
    """Batch 1 x 8 kv heads at 16k tokens, 132 splits, 50 back-to-back fused launches without a sync: every
    output equals the two-kernel path's (a missed ticket or a stale partial would show)."""
    k_cache, v_cache, bt, lens = make_paged_kv([16384], 8, 128, 16, torch.bfloat16, "cuda")
    q = torch.randn(50, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    ref = [paged_decode_attention(q[i], k_cache, v_cache, bt, lens, 0.088, num_splits=132, fuse_reduce=False)
           for i in range(50)]
    for interleave, merge_2d in ((False, False), (True, False), (False, True)):
        outs = [paged_decode_attention(q[i], k_cache, v_cache, bt, lens, 0.088, num_splits=132,
                                       fuse_reduce=True, interleave=interleave, merge_2d=merge_2d)
                for i in range(50)]
        for o, r in zip(outs, ref):
            assert_rel_close(o, r, 1e-3)  # one split of 132 missing would be ~1e-2 off
