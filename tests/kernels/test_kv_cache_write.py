import pytest
import torch
from _util import poisoned

from kernels.kv_cache_write import write_kv_cache, write_kv_cache_ref


@pytest.mark.parametrize(
    "num_kv_heads,head_dim,block_size,dtype",
    [(2, 64, 16, torch.float32), (3, 128, 32, torch.float16), (1, 16, 16, torch.float32)],
)
def test_write_matches_reference(device, num_kv_heads, head_dim, block_size, dtype):
    gen = torch.Generator().manual_seed(num_kv_heads * head_dim)
    num_blocks, num_tokens = 6, 11
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # padding tokens: skipped
    qkv = torch.randn(num_tokens, 4 + 2 * num_kv_heads, head_dim, generator=gen).to(
        device=device, dtype=dtype
    )
    k, v = (
        qkv[:, 4 : 4 + num_kv_heads],
        qkv[:, 4 + num_kv_heads :],
    )  # strided views, as out of a qkv projection
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = poisoned(shape, dtype, device), poisoned(shape, dtype, device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_cache(k, v, k_cache, v_cache, slots.to(device))
    write_kv_cache_ref(k, v, k_ref, v_ref, slots.to(device))
    torch.testing.assert_close(k_cache, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_ref, rtol=0, atol=0, equal_nan=True)
    assert (
        torch.isnan(k_cache).sum() == (num_blocks * block_size - (num_tokens - 2)) * num_kv_heads * head_dim
    )


def test_write_rejects_bad_inputs(device):
    k = torch.randn(3, 2, 64, device=device)
    cache = torch.randn(4, 16, 2, 64, device=device)
    slots = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_cache(k, k, cache, cache.clone(), slots.int())
    with pytest.raises(ValueError, match="k_cache"):
        write_kv_cache(k, k, torch.randn(4, 16, 4, 32, device=device), cache.clone(), slots)
    with pytest.raises(ValueError, match="contiguous"):
        write_kv_cache(k, k, cache.transpose(0, 1), cache.clone(), slots)


@pytest.mark.gpu
def test_write_bf16_real_shapes():
    k = torch.randn(4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    shape = (2048, 16, 8, 128)
    k_cache, v_cache = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16),
        torch.randn(shape, device="cuda", dtype=torch.bfloat16),
    )
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(2048 * 16, device="cuda")[:4096]
    slots[::97] = -1
    write_kv_cache(k, v, k_cache, v_cache, slots)
    write_kv_cache_ref(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
