"""How many KV blocks the engine gets, and the capacity line operators grep for."""

from __future__ import annotations

from shared_engine.config import EngineConfig

DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 1024**3  # bytes


def num_kv_blocks(config: EngineConfig, bytes_per_block: int, free_device_bytes: int | None) -> int:
    """Blocks in the pool: `num_gpu_blocks_override`, else `kv_cache_memory` bytes, else (CUDA) the
    `free_device_bytes` left under `gpu_memory_utilization` after weights and peak activations, else
    (CPU) 2 GiB."""
    cache = config.cache
    if cache.num_gpu_blocks_override is not None:
        return cache.num_gpu_blocks_override
    if cache.kv_cache_memory is not None:
        budget = cache.kv_cache_memory
    elif free_device_bytes is not None:
        budget = free_device_bytes
    else:
        budget = DEFAULT_CPU_KV_CACHE_MEMORY
    return max(0, budget // bytes_per_block)


def check_fits(num_blocks: int, block_size: int, max_model_len: int) -> None:
    """Raise `ValueError` when not even one request of `max_model_len` tokens fits in the pool."""
    capacity = num_blocks * block_size
    if capacity < max_model_len:
        raise ValueError(
            f"max_model_len {max_model_len:,} tokens does not fit in the KV cache ({capacity:,} tokens in "
            f"{num_blocks} blocks of {block_size}): lower max_model_len or give the cache more memory "
            f"(kv_cache_memory, gpu_memory_utilization or num_gpu_blocks_override)"
        )


def capacity_line(num_blocks: int, block_size: int, max_model_len: int) -> str:
    tokens = num_blocks * block_size
    return (
        f"KV cache size: {tokens:,} tokens, maximum concurrency for {max_model_len:,} tokens per request: "
        f"{tokens / max_model_len:.2f}x"
    )
