"""Architecture name (from `config.json`) → model class."""

from __future__ import annotations

from shared_engine.model_arch import SUPPORTED_ARCHITECTURES
from shared_engine.model_executor.models.llama import LlamaForCausalLM

MODEL_CLASSES = {name: LlamaForCausalLM for name in SUPPORTED_ARCHITECTURES}


def get_model_class(architecture: str):
    if architecture not in MODEL_CLASSES:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(MODEL_CLASSES)}")
    return MODEL_CLASSES[architecture]
