"""KV cache (paged) settings."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_choice, check_range

BLOCK_SIZES = {1, 2, 4, 8, 16, 32, 64, 128}
KV_CACHE_DTYPES = {"auto", "fp8", "fp8_e4m3"}  # vLLM's names; fp8 = fp8_e4m3 (float8_e4m3fn)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    The pool size comes from, in order: `num_gpu_blocks_override` (blocks, any device);
    `kv_cache_memory` (bytes, any device; the CPU default is 2 GiB); `gpu_memory_utilization` (fraction of
    device memory the engine may claim on CUDA, KV cache = that minus weights and peak activations).

    Session pins (core/session_pins.py; Continuum's KV time-to-live): a finished turn with a session id
    keeps its cached prefix blocks out of eviction for `session_pin_ttl` seconds (0: off) or until the
    session's next turn; `max_pinned_blocks` caps the pinned block references (None: half the pool), the
    oldest pin going first. Needs prefix caching.

    KV offload (core/host_kv_tier.py, model_executor/kv_offloader.py): `kv_offload_size` GiB of host memory
    (pinned on CUDA; per tensor-parallel rank) keep cached prefix blocks evicted from the GPU pool, copied
    back on a prefix hit instead of recomputed (0: off). Needs prefix caching.

    `kv_cache_dtype` (vLLM's flag): "auto" stores K/V in the model's dtype; "fp8" (= "fp8_e4m3") in
    float8_e4m3fn, one byte per element, so the same memory holds twice the bf16 tokens (four times fp32's).
    Each layer has a K and a V scale (cached = fp8(clamp(x / scale, +-448))), 1.0: vLLM's default when the
    checkpoint brings no scales (kernels/fp8.py gives the rounding error).
    """

    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    prefix_cache_eviction: str = "lru"
    prefix_caching_hash_algo: str = "sha256"
    session_pin_ttl: float = 0.0
    max_pinned_blocks: int | None = None
    kv_offload_size: float = 0.0
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        check_choice("block_size", self.block_size, BLOCK_SIZES)
        check_range("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        check_range("kv_cache_memory", self.kv_cache_memory, 1, allow_none=True)
        check_range("num_gpu_blocks_override", self.num_gpu_blocks_override, 1, allow_none=True)
        check_choice("prefix_cache_eviction", self.prefix_cache_eviction, {"lru", "cost"})
        check_choice("prefix_caching_hash_algo", self.prefix_caching_hash_algo, {"sha256", "builtin"})
        check_range("session_pin_ttl", self.session_pin_ttl, 0.0, 86400.0)
        check_range("max_pinned_blocks", self.max_pinned_blocks, 0, allow_none=True)
        check_range("kv_offload_size", self.kv_offload_size, 0.0, 4096.0)
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if self.kv_offload_size > 0 and not self.enable_prefix_caching:
            raise ValueError("kv_offload_size needs enable_prefix_caching (the host tier keeps prefix-cache blocks)")

    @property
    def fp8_kv_cache(self) -> bool:
        return self.kv_cache_dtype != "auto"

    def num_host_blocks(self, bytes_per_block: int) -> int:
        """Blocks in the KV offload tier: `kv_offload_size` GiB over one block's bytes (the busiest rank's);
        0 when offload is off."""
        if self.kv_offload_size <= 0:
            return 0
        return int(self.kv_offload_size * 1024**3) // bytes_per_block
