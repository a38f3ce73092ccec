import pytest
import torch
from _util import assert_rel_close, poisoned, rel_tol

from kernels.paged_decode_attention import paged_decode_attention_ref
from kernels.shared_prefix_decode_attention import (
    choose_num_prefix_splits,
    shared_prefix_decode_attention,
    shared_prefix_decode_attention_ref,
)


def make_shared_prefix_batch(prefix_len, suffix_lens, num_kv_heads, head_dim, block_size, dtype, device, gen):
    """Random K/V caches; every block table starts with the same shuffled prefix blocks, then its own.

    Returns k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], block_tables int32
    [num_seqs, max_blocks_per_seq + 1], context_lens int32 [num_seqs], prefix_blocks int32
    [prefix_blocks + 2] (two unused trailing entries, as a graph-captured buffer would have) and
    prefix_len int32 [1]."""
    num_prefix = prefix_len // block_size
    own = [-(-n // block_size) for n in suffix_lens]
    num_blocks = num_prefix + sum(own) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, generator=gen).int()
    prefix_blocks = torch.zeros(num_prefix + 2, dtype=torch.int32)
    prefix_blocks[:num_prefix] = perm[:num_prefix]
    block_tables = torch.zeros(len(suffix_lens), num_prefix + max(own) + 1, dtype=torch.int32)
    used = num_prefix
    for s, nb in enumerate(own):
        block_tables[s, :num_prefix] = perm[:num_prefix]
        block_tables[s, num_prefix : num_prefix + nb] = perm[used : used + nb]
        used += nb
    lens = torch.tensor([prefix_len + n for n in suffix_lens], dtype=torch.int32)
    plen = torch.tensor([prefix_len], dtype=torch.int32)
    return [t.to(device) for t in (k_cache, v_cache, block_tables, lens, prefix_blocks, plen)]


# (prefix_len, suffix_lens, num_q_heads, num_kv_heads, head_dim, block_size, prefix_splits, suffix_splits)
CASES = [
    (0, [1, 16, 37], 2, 2, 64, 16, None, None),  # no prefix: the suffix phase does everything
    (16, [1, 15, 16, 17], 4, 1, 64, 16, 1, 1),  # one prefix block, GQA 4, suffixes around a block boundary
    (96, [1, 32, 45], 4, 4, 64, 32, 3, 2),  # several prefix blocks over several splits, GQA 1
    (64, [2, 33], 8, 2, 128, 16, 2, 1),  # head_dim 128, GQA 4
    (64, [31, 32, 33, 64], 2, 2, 128, 32, 2, 2),  # block size 32, head_dim 128, suffixes at boundaries
    (32, [1], 2, 2, 64, 32, 4, 3),  # more splits than prefix / suffix tokens: empty splits, no NaN
]


@pytest.mark.parametrize("prefix_len,suffix_lens,hq,hk,d,bs,p_splits,s_splits", CASES)
def test_matches_reference(device, prefix_len, suffix_lens, hq, hk, d, bs, p_splits, s_splits):
    gen = torch.Generator().manual_seed(prefix_len * 1000 + len(suffix_lens) * 10 + hq)
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(
        prefix_len, suffix_lens, hk, d, bs, torch.float32, device, gen
    )
    q = torch.randn(len(suffix_lens), hq, d, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    shared_prefix_decode_attention(
        q, k_cache, v_cache, bt, lens, pblocks, plen, d**-0.5, out=out,
        num_prefix_splits=p_splits, num_suffix_splits=s_splits,
    )  # fmt: skip
    ref = shared_prefix_decode_attention_ref(q, k_cache, v_cache, bt, lens, pblocks, plen, d**-0.5)
    tol = rel_tol(torch.float32, device, uses_dot=True)
    assert_rel_close(out, ref, tol)
    assert_rel_close(out, paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, d**-0.5), tol)


def test_m_tiles_and_default_splits(device):
    """More (sequence, query head) rows than one M tile, with the launcher's default split counts."""
    gen = torch.Generator().manual_seed(3)
    suffix_lens = [1, 7, 16, 30, 9, 2, 17, 5, 32]  # 9 seqs x GQA 4 = 36 rows > block_m 16
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(
        48, suffix_lens, 1, 64, 16, torch.float32, device, gen
    )
    q = torch.randn(len(suffix_lens), 4, 64, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    shared_prefix_decode_attention(q, k_cache, v_cache, bt, lens, pblocks, plen, 0.125, out=out, block_m=16)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


def test_prefix_is_read_through_prefix_blocks(device):
    """The prefix phase reads prefix_blocks, and the suffix phase skips the block tables' prefix columns:
    scrambling those columns must not change the result."""
    gen = torch.Generator().manual_seed(9)
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(
        48, [5, 16], 2, 64, 16, torch.float32, device, gen
    )
    q = torch.randn(2, 8, 64, generator=gen).to(device)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)
    scrambled = bt.clone()
    scrambled[:, :3] = scrambled[:, 3:4]  # the prefix columns now point at a suffix block
    out = shared_prefix_decode_attention(q, k_cache, v_cache, scrambled, lens, pblocks, plen, 0.125)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


def test_one_launch_config_serves_two_prefix_lens(device):
    """Same arguments, split counts and max_prefix_len; only the prefix_len tensor's value changes (as in a
    CUDA graph replay). A 64-token shared prefix can also be treated as a 32-token one."""
    gen = torch.Generator().manual_seed(11)
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(
        64, [3, 20], 2, 64, 16, torch.float32, device, gen
    )
    q = torch.randn(2, 4, 64, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)

    def launch():
        kw = dict(out=out, max_prefix_len=96, num_prefix_splits=2, num_suffix_splits=2)
        shared_prefix_decode_attention(q, k_cache, v_cache, bt, lens, pblocks, plen, 0.125, **kw)

    tol = rel_tol(torch.float32, device, uses_dot=True)
    for value in (64, 32, 0):
        plen.fill_(value)
        out.fill_(float("nan"))
        launch()
        assert_rel_close(out, ref, tol)


def test_reference_checks_contract(device):
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(
        32, [4, 5], 2, 16, 16, torch.float32, device, gen
    )
    q = torch.randn(2, 2, 16, device=device)
    args = (q, k_cache, v_cache)
    bad = bt.clone()
    bad[1, 1] = (bad[1, 1] + 1) % k_cache.shape[0]
    with pytest.raises(ValueError, match="prefix_blocks"):
        shared_prefix_decode_attention_ref(*args, bad, lens, pblocks, plen, 0.25)
    with pytest.raises(ValueError, match="multiple of block_size"):
        shared_prefix_decode_attention_ref(*args, bt, lens, pblocks, plen - 8, 0.25)
    with pytest.raises(ValueError, match=">= prefix_len"):
        shared_prefix_decode_attention_ref(*args, bt, lens - 10, pblocks, plen, 0.25)


def test_rejects_bad_inputs(device):
    gen = torch.Generator().manual_seed(6)
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(16, [5], 2, 64, 16, torch.float32, device, gen)
    q = torch.randn(1, 4, 64, device=device)

    def call(**kw):
        args = dict(
            q=q, k_cache=k_cache, v_cache=v_cache, block_tables=bt, context_lens=lens,
            prefix_blocks=pblocks, prefix_len=plen, scale=0.1,
        )  # fmt: skip
        shared_prefix_decode_attention(**{**args, **kw})

    with pytest.raises(ValueError, match="device tensor"):
        call(prefix_len=16)
    with pytest.raises(ValueError, match="prefix_len must be an int32"):
        call(prefix_len=plen.long())
    with pytest.raises(ValueError, match="prefix_len must be an int32"):
        call(prefix_len=torch.tensor([16, 16], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="prefix_blocks"):
        call(prefix_blocks=pblocks.long())
    with pytest.raises(ValueError, match="max_prefix_len"):
        call(max_prefix_len=pblocks.shape[0] * 16 + 1)
    with pytest.raises(ValueError, match="context_lens"):
        call(context_lens=lens.long())
    with pytest.raises(ValueError, match="multiple"):
        call(q=torch.randn(1, 3, 64, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        call(k_cache=k_cache.transpose(0, 1))
    with pytest.raises(ValueError, match="dtypes differ"):
        call(q=q.half())
    with pytest.raises(ValueError, match="block_m"):
        call(block_m=48)
    with pytest.raises(ValueError, match="out"):
        call(out=torch.empty(1, 4, 32, device=device))


def test_choose_num_prefix_splits_depends_on_ints_only():
    assert choose_num_prefix_splits(4, 8, 32768, 1) == 9  # RAG batch: 60 seqs x GQA 4 = 4 M tiles of 64
    assert choose_num_prefix_splits(1, 8, 32768, 1) > choose_num_prefix_splits(4, 8, 32768, 1)
    assert choose_num_prefix_splits(1, 1, 100, 1) == 1
    assert choose_num_prefix_splits(1, 1, 1 << 20, 60) == 4  # prefix + suffix splits stay within 64


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hk,bs", [(32, 8, 16), (32, 8, 32), (16, 16, 16)])
@pytest.mark.parametrize("prefix_len", [0, 512, 4096])
def test_bf16_real_shapes(hq, hk, bs, prefix_len):
    gen = torch.Generator().manual_seed(prefix_len + hq + bs)
    suffix_lens = torch.randint(1, 2000, (30,), generator=gen).tolist() + [1, bs, 2048]
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(
        prefix_len, suffix_lens, hk, 128, bs, torch.bfloat16, "cuda", gen
    )
    q = torch.randn(len(suffix_lens), hq, 128, generator=gen).to("cuda", torch.bfloat16)
    out = poisoned(q.shape, q.dtype, "cuda")
    shared_prefix_decode_attention(q, k_cache, v_cache, bt, lens, pblocks, plen, 128**-0.5, out=out)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 128**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.bfloat16, "cuda"))


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_prefix_len():
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(
        1024, [700, 3, 2049, 128], 8, 128, 16, torch.bfloat16, "cuda", gen
    )
    q = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    args = (q, k_cache, v_cache, bt, lens, pblocks, plen, 0.088)
    kw = dict(out=out, max_prefix_len=pblocks.shape[0] * 16, max_context_len=bt.shape[1] * 16)
    shared_prefix_decode_attention(*args, **kw)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        shared_prefix_decode_attention(*args, **kw)
    for value in (512, 1024, 0):
        q.copy_(torch.randn_like(q))
        plen.fill_(value)
        graph.replay()
        ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.088)
        assert_rel_close(out, ref, rel_tol(torch.bfloat16, "cuda"))
