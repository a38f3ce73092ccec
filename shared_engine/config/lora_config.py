"""Multi-LoRA settings (vLLM's names: `--enable-lora`, `--max-loras`, `--max-lora-rank`, `--max-cpu-loras`)."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_range

LORA_KERNELS = ("sgmv", "bgmv")


@dataclass(frozen=True)
class LoRAConfig:
    """`max_loras`: GPU slots, so the most distinct adapters among running requests (the scheduler's limit
    per step). `max_lora_rank`: the largest rank accepted (and each slot's size). `max_cpu_loras`: adapters
    kept in the CPU cache (None: `max_loras`); an adapter a queued or running request uses is never evicted,
    so the cache may hold more while they run. `allowed_local_lora_path`: when set, every adapter path must
    resolve inside this directory (relative paths are taken under it); runtime loads cannot reach the rest of
    the file system. `enable_lora` off: requests cannot name adapters, and no slots are allocated.
    `lora_kernel` (CUDA; the CPU always runs the masked torch path): `sgmv` groups a step's tokens by adapter
    and reads each adapter's weights once per tile of its tokens (kernels/lora_sgmv.py), `bgmv` reads them
    once per token (kernels/lora_bgmv.py). `lora_slot_stream` (CUDA; off by default until measured on a GPU):
    slot loads on a copy stream of their own, ordered by events against the steps that read the slots
    (lora/slot_streams.py), instead of queued on the compute stream after the step in flight."""

    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    allowed_local_lora_path: str | None = None
    lora_kernel: str = "sgmv"
    lora_slot_stream: bool = False

    def __post_init__(self) -> None:
        check_range("max_loras", self.max_loras, 1, 256)
        check_range("max_lora_rank", self.max_lora_rank, 1, 512)
        check_range("max_cpu_loras", self.max_cpu_loras, self.max_loras, allow_none=True)
        if self.lora_kernel not in LORA_KERNELS:
            raise ValueError(f"lora_kernel must be one of {list(LORA_KERNELS)}, got {self.lora_kernel!r}")

    @property
    def cpu_cache_size(self) -> int:
        return self.max_cpu_loras or self.max_loras
