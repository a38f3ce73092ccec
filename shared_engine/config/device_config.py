"""Where the model runs."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_choice


@dataclass(frozen=True)
class DeviceConfig:
    """`device` is "auto" (CUDA when available, else CPU), "cpu" or "cuda"; `enforce_eager` turns off
    CUDA graphs."""

    device: str = "auto"
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        check_choice("device", self.device, {"auto", "cpu", "cuda"})

    def resolve(self) -> str:
        """The concrete device type ("cpu" or "cuda")."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
