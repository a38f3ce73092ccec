"""Where the model runs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shared_engine.config.validation import check_choice, check_range


@dataclass(frozen=True)
class DeviceConfig:
    """`device` is "auto" (CUDA when available, else CPU), "cpu" or "cuda"; `enforce_eager` turns off
    CUDA graphs; `cuda_graph_sizes` are the decode batch sizes captured (a decode-only step runs in the
    smallest captured graph that fits it, padded; larger ones run eagerly); a step that mixes prefill
    chunks (at most 8 sequences) with decodes also runs in a CUDA graph when its prefill tokens are at most
    `cuda_graph_max_prefill_tokens` (0: only decode-only steps are graphed; larger steps are compute-bound
    and run eagerly).

    `num_threads`: torch's intra-op threads in the engine process (`torch.set_num_threads`; the OpenMP
    threads of every CPU kernel). None: `OMP_NUM_THREADS` when set, else `default_num_threads()`. Set on
    the CPU, and on CUDA only when given (there the host runs no heavy kernels).

    `nano_batch_min_decodes`: decode-only steps of at least this many rows run as two nano-batches on two CUDA
    streams whose attention and GEMMs overlap (NanoFlow; model_executor/nano_batch.py), in the decode CUDA
    graphs of that size and up; 0: off, else at least 16. Not with tensor parallelism. On the CPU the
    nano-batches run one after the other (no gain)."""

    device: str = "auto"
    enforce_eager: bool = False
    cuda_graph_sizes: tuple[int, ...] = (
        1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
    cuda_graph_max_prefill_tokens: int = 2048
    num_threads: int | None = None
    nano_batch_min_decodes: int = 0

    def __post_init__(self) -> None:
        check_choice("device", self.device, {"auto", "cpu", "cuda"})
        object.__setattr__(self, "cuda_graph_sizes", tuple(sorted({int(s) for s in self.cuda_graph_sizes})))
        if not self.cuda_graph_sizes or self.cuda_graph_sizes[0] < 1:
            raise ValueError(f"cuda_graph_sizes must be positive batch sizes, got {self.cuda_graph_sizes}")
        check_range("cuda_graph_max_prefill_tokens", self.cuda_graph_max_prefill_tokens, 0, 65536)
        check_range("num_threads", self.num_threads, 1, 4096, allow_none=True)
        check_range("nano_batch_min_decodes", self.nano_batch_min_decodes, 0, 1 << 20)
        if 0 < self.nano_batch_min_decodes < 16:
            raise ValueError("nano_batch_min_decodes must be 0 (off) or at least 16 (two nano-batches of >= 8 rows), "
                             f"got {self.nano_batch_min_decodes}")

    def resolve_num_threads(self) -> int:
        """`num_threads`, else a valid `OMP_NUM_THREADS`, else `default_num_threads()`."""
        if self.num_threads is not None:
            return self.num_threads
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        if env.isdigit() and int(env) >= 1:
            return int(env)
        return default_num_threads()

    def resolve(self) -> str:
        """The concrete device type ("cpu" or "cuda")."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def default_num_threads() -> int:
    """The cores this process may run on (its CPU affinity, which container CPU sets narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)
