"""FP8 (e4m3) KV cache in every kernel that touches the cache: the KV write quantises with the layer's scale
and saturates (bit-equal to the torch reference), and decode, prefill and shared-prefix attention over an
FP8 cache equal the fp32 references over the dequantised cache (float(q) * scale). On the CPU these run in
Triton's interpreter, which loads, stores and casts float8_e4m3fn as CUDA does (checked bit-equal here)."""

import pytest
import torch
from _util import assert_rel_close, make_paged_kv, poisoned, rel_tol
from test_shared_prefix_decode_attention import make_shared_prefix_batch

from kernels.fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8_ref, quantize_fp8_ref
from kernels.kv_cache_write import write_kv_cache, write_kv_cache_ref
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from kernels.shared_prefix_decode_attention import shared_prefix_decode_attention

K_SCALE, V_SCALE = 0.05, 0.02  # not 1.0, so a scale applied twice, inverted or swapped shows


def fp8_caches(k_cache, v_cache):
    """Quantise random float caches (values ~N(0, 1) * 4) with the test scales; returns (k8, v8, k_deq, v_deq)."""
    k8, v8 = quantize_fp8_ref(k_cache * 4, K_SCALE), quantize_fp8_ref(v_cache * 4, V_SCALE)
    return k8, v8, dequantize_fp8_ref(k8, K_SCALE), dequantize_fp8_ref(v8, V_SCALE)


def test_quantise_saturates_and_rounds_within_e4m3_precision():
    x = torch.tensor([0.0, 1.0, -3.3, 447.0, 449.0, 1e6, -1e30, 2.0**-6, 2.0**-9])
    q = quantize_fp8_ref(x, 1.0)
    assert q.dtype == FP8_DTYPE
    back = dequantize_fp8_ref(q, 1.0)
    assert back[5] == FP8_MAX and back[6] == -FP8_MAX and back[4] == FP8_MAX  # saturated, not NaN
    assert back[0] == 0 and back[1] == 1 and back[7] == 2.0**-6 and back[8] == 2.0**-9
    y = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 3
    for scale in (1.0, 0.01, 4.0):
        err = (dequantize_fp8_ref(quantize_fp8_ref(y, scale), scale) - y).abs()
        ratio = (y / scale).abs()
        normal, sub = (ratio >= 2.0**-6) & (ratio <= FP8_MAX), ratio < 2.0**-6
        assert (err[normal] <= 2.0**-4 * y[normal].abs() + 1e-12).all()  # 3 mantissa bits, round to nearest
        assert (err[sub] <= 2.0**-10 * scale + 1e-12).all()  # subnormal steps of 2^-9
        assert (dequantize_fp8_ref(quantize_fp8_ref(y, scale), scale)[ratio > FP8_MAX].abs() == FP8_MAX * scale).all()
    with pytest.raises(ValueError, match="scale"):
        quantize_fp8_ref(y, 0.0)


@pytest.mark.parametrize("num_kv_heads,head_dim,block_size", [(2, 64, 16), (3, 128, 32)])
def test_write_quantises_bit_equal_to_reference(device, num_kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(head_dim)
    num_blocks, num_tokens = 5, 13
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(device)
    slots[[1, 6]] = -1
    qkv = torch.randn(num_tokens, 4 + 2 * num_kv_heads, head_dim, generator=gen).to(device)
    qkv[0, 4, :3] = torch.tensor([1e4, -1e4, 12.0])  # the first two beyond 448 * K_SCALE: saturate
    k, v = qkv[:, 4 : 4 + num_kv_heads], qkv[:, 4 + num_kv_heads :]  # strided views
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.zeros(shape, dtype=FP8_DTYPE, device=device)
    v_cache = torch.zeros(shape, dtype=FP8_DTYPE, device=device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_cache(k, v, k_cache, v_cache, slots, k_scale=K_SCALE, v_scale=V_SCALE)
    write_kv_cache_ref(k, v, k_ref, v_ref, slots, k_scale=K_SCALE, v_scale=V_SCALE)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    slot0 = int(slots[0])
    first = k_cache.view(-1, num_kv_heads, head_dim)[slot0, 0, :3].float()
    assert first.tolist() == [FP8_MAX, -FP8_MAX, 240.0]
    assert not torch.isnan(k_cache.float()).any()
    kept = slots >= 0
    deq = k_cache.view(-1, num_kv_heads, head_dim)[slots[kept]].float() * K_SCALE
    inside = k[kept].abs() < FP8_MAX * K_SCALE
    assert ((deq - k[kept]).abs()[inside] <= 2.0**-4 * k[kept].abs()[inside] + 2.0**-10 * K_SCALE).all()


# (context_lens, num_q_heads, num_kv_heads, head_dim, block_size, num_splits)
DECODE_CASES = [([1, 16, 37], 4, 4, 64, 16, 1), ([100, 17], 8, 2, 128, 16, 3), ([47, 96, 2], 9, 3, 64, 16, 4)]


@pytest.mark.parametrize("context_lens,hq,hk,d,bs,splits", DECODE_CASES)
def test_decode_over_fp8_cache_equals_dequantised_reference(device, context_lens, hq, hk, d, bs, splits):
    gen = torch.Generator().manual_seed(len(context_lens) * d + splits)
    k_cache, v_cache, bt, lens = make_paged_kv(context_lens, hk, d, bs, torch.float32, device, gen=gen)
    k8, v8, k_deq, v_deq = fp8_caches(k_cache, v_cache)
    q = torch.randn(len(context_lens), hq, d, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    paged_decode_attention(q, k8, v8, bt, lens, d**-0.5, out=out, num_splits=splits, k_scale=K_SCALE, v_scale=V_SCALE)
    ref = paged_decode_attention_ref(q, k_deq, v_deq, bt, lens, d**-0.5)
    assert torch.equal(ref, paged_decode_attention_ref(q, k8, v8, bt, lens, d**-0.5, K_SCALE, V_SCALE))
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


def test_decode_fp16_queries_over_fp8_cache(device):
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache, bt, lens = make_paged_kv([40, 9], 2, 64, 16, torch.float32, device, gen=gen)
    k8, v8, k_deq, v_deq = fp8_caches(k_cache, v_cache)
    q = torch.randn(2, 8, 64, generator=gen).to(device=device, dtype=torch.float16)
    out = paged_decode_attention(q, k8, v8, bt, lens, 0.125, num_splits=2, k_scale=K_SCALE, v_scale=V_SCALE)
    ref = paged_decode_attention_ref(q, k_deq, v_deq, bt, lens, 0.125)
    assert_rel_close(out, ref, rel_tol(torch.float16, device))


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_fp16_dots_over_fp8_cache_with_bf16_queries(device, splits):
    """fp8_f16 (paged_decode_attention's FP8_DOT_F16): bf16 q and the e4m3 tiles cast to fp16 for the dots; the
    output is bf16 and as close to the dequantised reference as bf16 dots get. (Triton 3.6's interpreter casts
    e4m3 to bf16 wrongly, ~1e6 relative error here, so the bf16-dot path is compared on CUDA only.)"""
    gen = torch.Generator().manual_seed(11 + splits)
    k_cache, v_cache, bt, lens = make_paged_kv([70, 5, 33], 2, 64, 16, torch.float32, device, gen=gen)
    k8, v8, k_deq, v_deq = fp8_caches(k_cache, v_cache)
    q = torch.randn(3, 8, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    ref = paged_decode_attention_ref(q, k_deq, v_deq, bt, lens, 0.125)
    for f16 in (True, False) if device == "cuda" else (True,):
        out = paged_decode_attention(q, k8, v8, bt, lens, 0.125, num_splits=splits, k_scale=K_SCALE, v_scale=V_SCALE,
                                     fp8_f16=f16)
        assert out.dtype == torch.bfloat16
        assert_rel_close(out, ref, rel_tol(torch.bfloat16, device))


@pytest.mark.parametrize("q_lens,prefixes,hq,hk,d,bs", [([5, 70], [0, 33], 4, 2, 64, 16), ([16], [100], 6, 3, 128, 32)])
def test_prefill_over_fp8_cache_equals_dequantised_reference(device, q_lens, prefixes, hq, hk, d, bs):
    gen = torch.Generator().manual_seed(sum(q_lens) + d)
    ctx = [p + n for p, n in zip(prefixes, q_lens)]
    k_cache, v_cache, bt, lens = make_paged_kv(ctx, hk, d, bs, torch.float32, device, gen=gen)
    k8, v8, k_deq, v_deq = fp8_caches(k_cache, v_cache)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    out = poisoned(q.shape, q.dtype, device)
    paged_prefill_attention(q, k8, v8, bt, cu, lens, d**-0.5, max_seqlen_q=max(q_lens), out=out,
                            k_scale=K_SCALE, v_scale=V_SCALE)
    ref = paged_prefill_attention_ref(q, k_deq, v_deq, bt, cu, lens, d**-0.5)
    assert torch.equal(ref, paged_prefill_attention_ref(q, k8, v8, bt, cu, lens, d**-0.5, K_SCALE, V_SCALE))
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


def test_shared_prefix_over_fp8_cache_equals_dequantised_reference(device):
    gen = torch.Generator().manual_seed(11)
    k_cache, v_cache, bt, lens, pblocks, plen = make_shared_prefix_batch(64, [1, 33, 40], 2, 64, 16,
                                                                         torch.float32, device, gen)
    k8, v8, k_deq, v_deq = fp8_caches(k_cache, v_cache)
    q = torch.randn(3, 8, 64, generator=gen).to(device)
    out = poisoned(q.shape, q.dtype, device)
    shared_prefix_decode_attention(q, k8, v8, bt, lens, pblocks, plen, 0.125, out=out, num_prefix_splits=2,
                                   num_suffix_splits=2, k_scale=K_SCALE, v_scale=V_SCALE)
    ref = paged_decode_attention_ref(q, k_deq, v_deq, bt, lens, 0.125)
    assert_rel_close(out, ref, rel_tol(torch.float32, device, uses_dot=True))


def test_fp8_cache_arguments_are_checked(device):
    k_cache, v_cache, bt, lens = make_paged_kv([20], 2, 64, 16, torch.float32, device)
    k8, v8, _, _ = fp8_caches(k_cache, v_cache)
    q = torch.randn(1, 4, 64, device=device)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_decode_attention(q, k8, v_cache, bt, lens, 0.125)
    with pytest.raises(ValueError, match="k_scale"):
        paged_decode_attention(q, k8, v8, bt, lens, 0.125, k_scale=0.0)
    with pytest.raises(ValueError, match="v_scale"):
        write_kv_cache(q[:, :2], q[:, :2], k8, v8, torch.zeros(1, dtype=torch.int64, device=device), v_scale=-1.0)
    with pytest.raises(ValueError, match="dtypes differ"):
        write_kv_cache(q[:, :2], q[:, :2], k8, v_cache, torch.zeros(1, dtype=torch.int64, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs,context", [(64, 2048), (1, 16384)])
def test_fp8_decode_bf16_real_shapes(num_seqs, context):
    """llama-3.1-8b's attention shapes (32/8 heads, head_dim 128) in bf16 over an FP8 cache, on CUDA."""
    gen = torch.Generator().manual_seed(num_seqs)
    k_cache, v_cache, bt, lens = make_paged_kv([context] * num_seqs, 8, 128, 16, torch.float32, "cuda", gen=gen)
    k8, v8, k_deq, v_deq = fp8_caches(k_cache, v_cache)
    del k_cache, v_cache
    q = torch.randn(num_seqs, 32, 128, generator=gen).to(device="cuda", dtype=torch.bfloat16)
    ref = paged_decode_attention_ref(q, k_deq, v_deq, bt, lens, 128**-0.5)
    for f16 in (False, True):  # bf16 dots, fp16 dots (FP8_DOT_F16)
        out = paged_decode_attention(q, k8, v8, bt, lens, 128**-0.5, k_scale=K_SCALE, v_scale=V_SCALE, fp8_f16=f16)
        assert_rel_close(out, ref, rel_tol(torch.bfloat16, "cuda"))
    q_pre = torch.randn(2048, 32, 128, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 2048], dtype=torch.int32, device="cuda")
    one = lens[:1].clone()
    out = paged_prefill_attention(q_pre, k8, v8, bt[:1], cu, one, 128**-0.5, max_seqlen_q=2048,
                                  k_scale=K_SCALE, v_scale=V_SCALE)
    ref = paged_prefill_attention_ref(q_pre, k_deq, v_deq, bt[:1], cu, one, 128**-0.5)
    assert_rel_close(out, ref, rel_tol(torch.bfloat16, "cuda"))


def test_kernel_rounding_equals_torch_cast_on_every_fp8_boundary(device):
    """The write kernel's own rounding against torch's cast at every e4m3 value, the midpoints between
    neighbours (ties to even), just either side of them, and beyond 448."""
    grid = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    grid = grid[torch.isfinite(grid)].unique()  # [-448, 448]
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([grid, mids, mids.nextafter(torch.tensor(1e9)), mids.nextafter(torch.tensor(-1e9)),
                   torch.tensor([460.0, 480.0, 1e9, -470.0])])
    n = x.numel()
    k = x.view(n, 1, 1).expand(n, 1, 16).contiguous().to(device)
    cache = torch.zeros(n, 1, 1, 16, dtype=FP8_DTYPE, device=device)
    write_kv_cache(k, k, cache, cache.clone(), torch.arange(n, device=device))
    assert torch.equal(cache[:, 0, 0, 0].view(torch.uint8).cpu(), quantize_fp8_ref(x, 1.0).view(torch.uint8))
