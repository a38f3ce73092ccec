"""Attention backend registry: `torch` (pure PyTorch over the paged cache, any device) and `triton`
(the kernels in `kernels/`, CUDA)."""

from __future__ import annotations

from collections.abc import Callable

_BACKENDS: dict[str, Callable] = {}


def register_backend(name: str):
    def wrap(cls):
        _BACKENDS[name] = cls
        return cls

    return wrap


def get_backend(name: str):
    """Instantiate a backend by name. Raises `ValueError` for an unknown name."""
    if name not in _BACKENDS:
        _import_builtin()
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name]()


def _import_builtin() -> None:
    from shared_engine.model_executor.attention import torch_backend, triton_backend  # noqa: F401
