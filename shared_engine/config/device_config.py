"""Where the model runs."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_choice, check_range


@dataclass(frozen=True)
class DeviceConfig:
    """`device` is "auto" (CUDA when available, else CPU), "cpu" or "cuda"; `enforce_eager` turns off
    CUDA graphs; `cuda_graph_sizes` are the decode batch sizes captured (a decode-only step runs in the
    smallest captured graph that fits it, padded; larger ones run eagerly); a step that mixes prefill
    chunks (at most 8 sequences) with decodes also runs in a CUDA graph when its prefill tokens are at most
    `cuda_graph_max_prefill_tokens` (0: only decode-only steps are graphed; larger steps are compute-bound
    and run eagerly)."""

    device: str = "auto"
    enforce_eager: bool = False
    cuda_graph_sizes: tuple[int, ...] = (
        1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
    cuda_graph_max_prefill_tokens: int = 2048

    def __post_init__(self) -> None:
        check_choice("device", self.device, {"auto", "cpu", "cuda"})
        object.__setattr__(self, "cuda_graph_sizes", tuple(sorted({int(s) for s in self.cuda_graph_sizes})))
        if not self.cuda_graph_sizes or self.cuda_graph_sizes[0] < 1:
            raise ValueError(f"cuda_graph_sizes must be positive batch sizes, got {self.cuda_graph_sizes}")
        check_range("cuda_graph_max_prefill_tokens", self.cuda_graph_max_prefill_tokens, 0, 65536)

    def resolve(self) -> str:
        """The concrete device type ("cpu" or "cuda")."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
