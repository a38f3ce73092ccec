"""The model's shape for the capacity model: a preset name, a directory or file holding config.json, or None
for the embedded default model (SmolLM2-135M-Instruct, whose shape the `smollm2-135m` preset carries)."""

from __future__ import annotations

import json
from pathlib import Path

from shared_engine.model_arch import ModelArch
from shared_engine.model_loader.model_source import PRESETS_DIR, preset_names

DEFAULT_MODEL_PRESET = "smollm2-135m"


def resolve_arch(model: str | None) -> tuple[str, ModelArch]:
    """Return (name, shape) without loading weights or torch.

    Raises:
        ValueError: neither a preset nor a path to a config.json (the message lists the presets).
    """
    name = model or DEFAULT_MODEL_PRESET
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return name, ModelArch.from_dir(path)
    if path.is_file() and path.suffix == ".json":
        return name, ModelArch.from_dict(json.loads(path.read_text()))
    preset = PRESETS_DIR / f"{name}.json"
    if preset.exists():
        return name, ModelArch.from_dict(json.loads(preset.read_text()))
    raise ValueError(f"model {name!r}: not a preset ({', '.join(preset_names())}) nor a config.json path")
