"""Read and validate a PEFT LoRA adapter directory (`adapter_config.json` + `adapter_model.safetensors`).

A LoRA adapter adds `scaling * B @ A` to a base projection `W` [out, in] (Hu et al. 2021,
https://arxiv.org/abs/2106.09685): `A` [r, in], `B` [out, r], `scaling = lora_alpha / r`, or
`lora_alpha / sqrt(r)` with rsLoRA (Kalajdzievski 2023, https://arxiv.org/abs/2312.03732; PEFT's
`use_rslora`). Supported targets: the attention and MLP projections of the Llama family (q, k, v, o, gate,
up, down; any subset, any subset of layers). Everything is checked before the adapter is accepted, and each
failure raises `LoRAValidationError` naming the problem; an adapter that loads here cannot fail at first use
for shape reasons.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shared_engine.lora.errors import LoRAValidationError
from shared_engine.model_arch import ModelArch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_FLOAT_DTYPES = {torch.float16, torch.bfloat16, torch.float32}
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (an in-memory state dict adds ".default")
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.[\w-]+)?\.weight$")
_UNSUPPORTED_OPTIONS = (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out"))


@dataclass
class LoRAAdapter:
    """One adapter's weights on the CPU, ready to copy into a GPU slot.

    `weights[(layer, module)] = (A [rank, in], B_scaled [out, rank])`, fp32, with the scaling folded into B,
    so the delta of a token `x` [in] is `B_scaled @ (A @ x)`. Layers and modules the adapter does not target
    are absent (they add nothing).
    """

    name: str
    rank: int
    scaling: float
    target_modules: tuple[str, ...]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    base_model_name_or_path: str | None = None

    @property
    def num_bytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def module_shapes(arch: ModelArch) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each targetable projection of `arch`."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def resolve_adapter_path(path: str, allowed_dir: str | None) -> Path:
    """The adapter directory, symlinks and `..` resolved. With `allowed_dir`, a relative `path` is taken
    under it and the resolved path must stay inside it.

    Raises:
        LoRAValidationError: an empty path, or one that escapes `allowed_dir`.
    """
    if not path or not str(path).strip():
        raise LoRAValidationError("lora_path must be a non-empty path")
    if allowed_dir is None:
        return Path(os.path.realpath(path))
    root = Path(os.path.realpath(allowed_dir))
    resolved = Path(os.path.realpath(root / path))
    if resolved != root and root not in resolved.parents:
        raise LoRAValidationError(f"lora_path {path!r} is outside the allowed adapter directory {str(root)!r}")
    return resolved


def content_digest(path: Path) -> str:
    """sha256 (first 16 hex digits) of the adapter's config and weights files: the adapter's version."""
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        digest.update((path / name).read_bytes())
    return digest.hexdigest()[:16]


def read_adapter_config(path: Path, max_lora_rank: int) -> dict:
    """Parse and check `adapter_config.json`. Raises `LoRAValidationError`."""
    if not path.is_dir():
        raise LoRAValidationError(f"adapter directory {str(path)!r} does not exist")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            extra = " (only safetensors weights are supported)" if name == WEIGHTS_FILE and (
                path / "adapter_model.bin").exists() else ""
            raise LoRAValidationError(f"adapter {str(path)!r} has no {name}{extra}")
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LoRAValidationError(f"{CONFIG_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise LoRAValidationError(f"{CONFIG_FILE} must be a JSON object")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise LoRAValidationError(f"peft_type {cfg.get('peft_type')!r} is not supported (only LORA)")
    rank = cfg.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoRAValidationError(f"adapter rank r must be a positive integer, got {rank!r}")
    if rank > max_lora_rank:
        raise LoRAValidationError(f"adapter rank {rank} exceeds max_lora_rank {max_lora_rank}")
    for key, label in _UNSUPPORTED_OPTIONS:
        if cfg.get(key):
            raise LoRAValidationError(f"adapter option {label} is not supported")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise LoRAValidationError("per-module rank_pattern / alpha_pattern are not supported")
    if cfg.get("bias", "none") != "none":
        raise LoRAValidationError(f"adapter bias {cfg['bias']!r} is not supported (only 'none')")
    if cfg.get("modules_to_save"):
        raise LoRAValidationError(f"modules_to_save {cfg['modules_to_save']!r} is not supported")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(TARGET_MODULES))
        if unknown:
            raise LoRAValidationError(f"unknown target modules {unknown}; supported: {list(TARGET_MODULES)}")
    alpha = cfg.get("lora_alpha", rank)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise LoRAValidationError(f"lora_alpha must be a number, got {alpha!r}")
    return cfg


def load_adapter(name: str, path: Path, arch: ModelArch, max_lora_rank: int) -> LoRAAdapter:
    """Read, validate and scale an adapter for the base model `arch`.

    Raises:
        LoRAValidationError: see the module docstring; the message names the file, tensor or option.
    """
    from safetensors import SafetensorError, safe_open

    cfg = read_adapter_config(path, max_lora_rank)
    rank = cfg["r"]
    alpha = float(cfg.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    shapes = module_shapes(arch)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(path / WEIGHTS_FILE), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                layer, module, half = _parse_key(key, arch, shapes)
                tensor = f.get_tensor(key)
                _check_tensor(key, tensor, half, rank, shapes[module])
                halves.setdefault((layer, module), {})[half] = tensor.float()
    except SafetensorError as exc:
        raise LoRAValidationError(f"{WEIGHTS_FILE} cannot be read: {exc}") from exc
    if not halves:
        raise LoRAValidationError(f"{WEIGHTS_FILE} holds no LoRA tensors")
    adapter = LoRAAdapter(name, rank, scaling, tuple(sorted({m for _, m in halves})),
                          base_model_name_or_path=cfg.get("base_model_name_or_path"))
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            missing = ({"A", "B"} - set(pair)).pop()
            raise LoRAValidationError(f"layer {layer} {module} has no lora_{missing} tensor")
        adapter.weights[(layer, module)] = (pair["A"].contiguous(), (pair["B"] * scaling).contiguous())
    return adapter


def _parse_key(key: str, arch: ModelArch, shapes: dict) -> tuple[int, str, str]:
    match = _KEY.match(key)
    if match is None:
        raise LoRAValidationError(f"tensor {key!r} is not a LoRA weight of a supported projection "
                                  f"(supported target modules: {list(TARGET_MODULES)})")
    layer, module, half = int(match.group(1)), match.group(2), match.group(3)
    if module not in shapes:
        raise LoRAValidationError(f"unknown target module {module!r} in {key!r}; supported: {list(TARGET_MODULES)}")
    if layer >= arch.num_layers:
        raise LoRAValidationError(f"tensor {key!r}: layer {layer} does not exist (the base model has "
                                  f"{arch.num_layers} layers)")
    return layer, module, half


def _check_tensor(key: str, tensor: torch.Tensor, half: str, rank: int, in_out: tuple[int, int]) -> None:
    if tensor.dtype not in _FLOAT_DTYPES:
        raise LoRAValidationError(f"tensor {key!r} has dtype {tensor.dtype}; supported: float16, bfloat16, float32")
    fan_in, fan_out = in_out
    expected = (rank, fan_in) if half == "A" else (fan_out, rank)
    if tuple(tensor.shape) != expected:
        raise LoRAValidationError(f"tensor {key!r} has shape {tuple(tensor.shape)}, expected {expected} for rank "
                                  f"{rank} on this base model")
    if not torch.isfinite(tensor).all():
        raise LoRAValidationError(f"tensor {key!r} has non-finite values")
