"""`write_layer_subset`: a model made of another's first layers (its embeddings, first `num_layers` decoder
layers, final norm and LM head), written as a Hugging Face directory: a draft model with the target's
tokenizer and no training (self-speculative drafting, as LayerSkip's early exit without the fine-tuning)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
           "chat_template.jinja", "vocab.json", "merges.txt")


def write_layer_subset(source: Path, target: Path, num_layers: int) -> Path:
    """Write `target` (created) from the model directory `source`, keeping decoder layers [0, num_layers).

    Raises:
        ValueError: `num_layers` outside [1, the source's layer count].
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((source / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"num_layers must be in [1, {config['num_hidden_layers']}], got {num_layers}")
    target.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for file in sorted(source.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                match = _LAYER.match(name)
                if match is None or int(match.group(1)) < num_layers:
                    tensors[name] = f.get_tensor(name)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}, indent=2))
    for name in _COPIED:
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    return target
