"""Adapters for the LoRA tests: random PEFT-format adapters on the default model (written once per session)
and the reference that every engine output is held to, PEFT's merged model (transformers + peft, fp32)."""

from __future__ import annotations

import pytest
import torch

from shared_engine.lora.adapter_factory import write_random_adapter
from shared_engine.model_arch import ModelArch

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name → (rank, target modules, lora_alpha, rsLoRA, layers, dtype): ranks, subsets, scalings and dtypes differ
ADAPTERS = {
    "qv8": (8, ["q_proj", "v_proj"], 16, False, None, torch.float32),
    "all16": (16, ALL, 8, True, None, torch.float32),
    "mlp4": (4, ["o_proj", "gate_proj", "down_proj"], 8, False, list(range(0, 30, 2)), torch.bfloat16),
}


@pytest.fixture(scope="session")
def default_arch(default_model_dir):
    return ModelArch.from_dir(default_model_dir)


@pytest.fixture(scope="session")
def adapter_dirs(tmp_path_factory, default_arch):
    root = tmp_path_factory.mktemp("adapters")
    dirs = {}
    for seed, (name, (rank, targets, alpha, rslora, layers, dtype)) in enumerate(ADAPTERS.items()):
        dirs[name] = write_random_adapter(root / name, default_arch, rank, targets, seed=seed + 1, lora_alpha=alpha,
                                          std=0.3, layers=layers, dtype=dtype, use_rslora=rslora)
    return dirs


def peft_greedy(model_dir, adapter_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations from transformers + peft's merged model (fp32, CPU); `adapter_dir` None: base."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    results = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_new_tokens, do_sample=False)
            results.append(out[0, len(ids):].tolist())
    return results
