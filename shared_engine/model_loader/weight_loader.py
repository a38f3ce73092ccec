"""Fill a model's parameters: from safetensors files, or random ("dummy") for benchmarks."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def load_safetensors(model: nn.Module, path: Path) -> None:
    """Load every `*.safetensors` file in `path` into `model` (via its `load_weights`).

    Raises:
        ValueError: no safetensors file, or parameters the checkpoint does not provide.
    """
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors file in {path}")
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names = list(f.keys())  # noqa: SIM118 (safe_open is not a dict)
            loaded |= model.load_weights((name, f.get_tensor(name)) for name in names)
    expected = {name for name, _ in model.named_parameters()}
    missing = sorted(expected - loaded - _tied(model))
    if missing:
        raise ValueError(f"checkpoint in {path} lacks {len(missing)} parameters, e.g. {missing[:3]}")


def init_dummy(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Random weights with the model's real shapes: normal(0, std) for matrices and biases, 1 for norm
    weights. Finite and of small variance, so activations stay well-scaled through every layer."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=gen)


def _tied(model: nn.Module) -> set[str]:
    arch = getattr(model, "arch", None)
    return {"lm_head.weight"} if arch is not None and arch.tie_word_embeddings else set()
