"""Model loading: the embedded default model, local Hugging Face directories, presets and dummy weights."""

from shared_engine.model_loader.model_source import ModelSource, resolve_model

__all__ = ["ModelSource", "resolve_model"]
