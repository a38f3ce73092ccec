"""KV cache (paged) settings."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_choice, check_range

BLOCK_SIZES = {1, 2, 4, 8, 16, 32, 64, 128}


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    The pool size comes from, in order: `num_gpu_blocks_override` (blocks, any device);
    `kv_cache_memory` (bytes, any device; the CPU default is 2 GiB); `gpu_memory_utilization` (fraction of
    device memory the engine may claim on CUDA, KV cache = that minus weights and peak activations).
    """

    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    prefix_cache_eviction: str = "lru"
    prefix_caching_hash_algo: str = "sha256"

    def __post_init__(self) -> None:
        check_choice("block_size", self.block_size, BLOCK_SIZES)
        check_range("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        check_range("kv_cache_memory", self.kv_cache_memory, 1, allow_none=True)
        check_range("num_gpu_blocks_override", self.num_gpu_blocks_override, 1, allow_none=True)
        check_choice("prefix_cache_eviction", self.prefix_cache_eviction, {"lru", "cost"})
        check_choice("prefix_caching_hash_algo", self.prefix_caching_hash_algo, {"sha256", "builtin"})
