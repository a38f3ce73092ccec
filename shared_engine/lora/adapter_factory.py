"""Write PEFT-format LoRA adapters with random weights (benchmark shapes and tests; no peft needed).

The files are exactly what `peft`'s `save_pretrained` writes for a LoRA adapter (`adapter_config.json`,
`adapter_model.safetensors` with keys `base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}
.weight`), so `peft.PeftModel.from_pretrained` reads them too (the tests' reference does).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shared_engine.lora.peft_adapter import CONFIG_FILE, TARGET_MODULES, WEIGHTS_FILE, module_shapes
from shared_engine.model_arch import ModelArch

_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_random_adapter(path: str | Path, arch: ModelArch, rank: int, target_modules=TARGET_MODULES,
                         seed: int = 0, lora_alpha: float | None = None, std: float = 1.0,
                         layers: list[int] | None = None, dtype: torch.dtype = torch.float32,
                         use_rslora: bool = False, base_model_name_or_path: str | None = None) -> Path:
    """A random adapter at `path`: `A` ~ N(0, 1/in), `B` ~ N(0, std^2/rank) for each targeted module of each
    layer in `layers` (default: all), so the delta of a unit-scale input is about `std * scaling` per
    output. Returns `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    shapes = module_shapes(arch)
    tensors = {}
    for layer in range(arch.num_layers) if layers is None else layers:
        for module in target_modules:
            fan_in, fan_out = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.{_PARENT[module]}.{module}"
            a = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            b = torch.randn(fan_out, rank, generator=gen) * std / rank**0.5
            tensors[f"{prefix}.lora_A.weight"] = a.to(dtype).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.to(dtype).contiguous()
    from safetensors.torch import save_file

    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    config = peft_config(rank, list(target_modules), rank if lora_alpha is None else lora_alpha, use_rslora,
                         base_model_name_or_path, layers)
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return path


def peft_config(rank: int, target_modules: list[str], lora_alpha: float, use_rslora: bool = False,
                base_model_name_or_path: str | None = None, layers: list[int] | None = None) -> dict:
    """The `adapter_config.json` fields PEFT writes for a causal-LM LoRA adapter."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": lora_alpha,
        "target_modules": target_modules, "lora_dropout": 0.0, "bias": "none", "use_rslora": use_rslora,
        "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None, "init_lora_weights": True,
        "layers_to_transform": layers, "rank_pattern": {}, "alpha_pattern": {},
        "base_model_name_or_path": base_model_name_or_path, "inference_mode": True,
    }
