"""Where a model comes from: the embedded default, a local Hugging Face directory, or a shape preset."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shared_engine.model_arch import ModelArch

PRESETS_DIR = Path(__file__).parent / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: `path` holds weights (None for a preset), `config` is its config.json dict,
    `tokenizer_path` a directory a tokenizer loads from (None: token-id prompts only)."""

    name: str
    path: Path | None
    config: dict
    tokenizer_path: Path | None

    @property
    def arch(self) -> ModelArch:
        return ModelArch.from_dict(self.config)

    def generation_eos_ids(self) -> set[int]:
        """EOS ids from generation_config.json (when present) and config.json."""
        ids = set(self.arch.eos_token_ids)
        if self.path is not None and (self.path / "generation_config.json").exists():
            eos = json.loads((self.path / "generation_config.json").read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return ids


def resolve_model(model: str | None, load_format: str = "auto", tokenizer: str | None = None) -> ModelSource:
    """Resolve `model` (None = the embedded default, a directory, or a preset name).

    Raises:
        ValueError: the name is neither a local directory with config.json nor a preset, or a preset is
            asked for with real weights (presets carry shapes only: use `load_format="dummy"`).
    """
    if model is None:
        from shared_engine.model_loader.default_model import DEFAULT_MODEL_NAME, default_model_dir

        path = default_model_dir()
        return ModelSource(DEFAULT_MODEL_NAME, path, _read_config(path), Path(tokenizer) if tokenizer else path)
    path = Path(model).expanduser()
    if (path / "config.json").exists():
        return ModelSource(model, path, _read_config(path), Path(tokenizer) if tokenizer else path)
    preset = PRESETS_DIR / f"{model}.json"
    if preset.exists():
        if load_format != "dummy":
            raise ValueError(f"preset {model!r} has shapes but no weights: use load_format='dummy'")
        return ModelSource(model, None, json.loads(preset.read_text()), Path(tokenizer) if tokenizer else None)
    raise ValueError(
        f"model {model!r} not found: not a local directory with config.json and not a preset "
        f"({', '.join(preset_names())}); model hubs are not used"
    )


def _read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
