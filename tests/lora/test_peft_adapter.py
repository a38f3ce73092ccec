"""Adapter validation before acceptance (no model needed): every kind of bad adapter is refused with a
`LoRAValidationError` naming the problem; good ones load with PEFT's scaling (lora_alpha / r, rsLoRA)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from shared_engine.lora import LoRARequest, LoRAValidationError
from shared_engine.lora.adapter_factory import write_random_adapter
from shared_engine.lora.peft_adapter import load_adapter, resolve_adapter_path
from shared_engine.model_arch import ModelArch


@pytest.fixture(scope="module")
def tiny_arch(tiny_model_dir):
    return ModelArch.from_dir(tiny_model_dir)


def write(tmp_path, arch, name="a", **kwargs):
    kwargs.setdefault("rank", 4)
    return write_random_adapter(tmp_path / name, arch, **kwargs)


def edit_config(path, **changes):
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))


def test_good_adapter_loads_with_scaling(tmp_path, tiny_arch):
    path = write(tmp_path, tiny_arch, rank=4, lora_alpha=8, target_modules=["q_proj", "down_proj"])
    adapter = load_adapter("a", path, tiny_arch, max_lora_rank=8)
    assert adapter.rank == 4 and adapter.scaling == 2.0 and adapter.target_modules == ("down_proj", "q_proj")
    raw = load_file(str(path / "adapter_model.safetensors"))
    a, b = adapter.weights[(1, "q_proj")]
    assert torch.equal(a, raw["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"])
    assert torch.allclose(b, 2.0 * raw["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"])
    rs = write(tmp_path, tiny_arch, "rs", rank=4, lora_alpha=8, use_rslora=True)
    assert load_adapter("rs", rs, tiny_arch, 8).scaling == pytest.approx(8 / math.sqrt(4))


def test_rank_over_the_limit_names_rank_and_limit(tmp_path, tiny_arch):
    path = write(tmp_path, tiny_arch, rank=16)
    with pytest.raises(LoRAValidationError, match="rank 16 exceeds max_lora_rank 8"):
        load_adapter("a", path, tiny_arch, max_lora_rank=8)


def test_wrong_base_shapes(tmp_path, tiny_arch, default_model_dir):
    other = ModelArch.from_dir(default_model_dir)  # an adapter for another model (hidden 576, not 64)
    path = write(tmp_path, other, rank=4, target_modules=["q_proj"], layers=[0])
    with pytest.raises(LoRAValidationError, match=r"has shape \(4, 576\), expected \(4, 64\)"):
        load_adapter("a", path, tiny_arch, 8)
    deep = write(tmp_path, other, "deep", rank=4, target_modules=["q_proj"], layers=[5])
    with pytest.raises(LoRAValidationError, match="layer 5 does not exist"):
        load_adapter("a", deep, tiny_arch, 8)


@pytest.mark.parametrize("missing", ["adapter_config.json", "adapter_model.safetensors"])
def test_missing_files(tmp_path, tiny_arch, missing):
    path = write(tmp_path, tiny_arch)
    (path / missing).unlink()
    with pytest.raises(LoRAValidationError, match=f"has no {missing}"):
        load_adapter("a", path, tiny_arch, 8)
    with pytest.raises(LoRAValidationError, match="does not exist"):
        load_adapter("a", tmp_path / "nowhere", tiny_arch, 8)


def test_pickle_weights_are_refused_by_name(tmp_path, tiny_arch):
    path = write(tmp_path, tiny_arch)
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    with pytest.raises(LoRAValidationError, match="only safetensors"):
        load_adapter("a", path, tiny_arch, 8)


def test_unknown_target_modules(tmp_path, tiny_arch):
    path = write(tmp_path, tiny_arch)
    edit_config(path, target_modules=["q_proj", "lm_head"])
    with pytest.raises(LoRAValidationError, match=r"unknown target modules \['lm_head'\]"):
        load_adapter("a", path, tiny_arch, 8)
    path = write(tmp_path, tiny_arch, "emb")
    tensors = load_file(str(path / "adapter_model.safetensors"))
    tensors["base_model.model.model.embed_tokens.lora_A.weight"] = torch.zeros(4, 128)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    with pytest.raises(LoRAValidationError, match="embed_tokens"):
        load_adapter("a", path, tiny_arch, 8)


def test_bad_dtype_missing_half_and_options(tmp_path, tiny_arch):
    path = write(tmp_path, tiny_arch, target_modules=["v_proj"], layers=[0])
    key = "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"
    tensors = load_file(str(path / "adapter_model.safetensors"))
    save_file({**tensors, key: tensors[key].to(torch.int32)}, str(path / "adapter_model.safetensors"))
    with pytest.raises(LoRAValidationError, match="dtype torch.int32"):
        load_adapter("a", path, tiny_arch, 8)
    save_file({key: tensors[key]}, str(path / "adapter_model.safetensors"))
    with pytest.raises(LoRAValidationError, match="no lora_B"):
        load_adapter("a", path, tiny_arch, 8)
    for option, message in [({"use_dora": True}, "DoRA"), ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                            ({"peft_type": "IA3"}, "peft_type"), ({"r": 0}, "positive integer"),
                            ({"rank_pattern": {"q_proj": 2}}, "rank_pattern")]:
        fresh = write(tmp_path, tiny_arch, f"opt{len(message)}{next(iter(option))}")
        edit_config(fresh, **option)
        with pytest.raises(LoRAValidationError, match=message):
            load_adapter("a", fresh, tiny_arch, 8)


def test_paths_escaping_the_allowed_directory(tmp_path, tiny_arch):
    allowed = tmp_path / "allowed"
    good = write(allowed, tiny_arch, "good")
    outside = write(tmp_path, tiny_arch, "outside")
    assert resolve_adapter_path("good", str(allowed)) == good.resolve()
    assert resolve_adapter_path(str(good), str(allowed)) == good.resolve()
    for bad in ["../outside", str(outside), "good/../../outside"]:
        with pytest.raises(LoRAValidationError, match="outside the allowed adapter directory"):
            resolve_adapter_path(bad, str(allowed))
    os.symlink(outside, allowed / "link")  # a symlink inside that points out
    with pytest.raises(LoRAValidationError, match="outside the allowed adapter directory"):
        resolve_adapter_path("link", str(allowed))
    with pytest.raises(LoRAValidationError, match="non-empty path"):
        resolve_adapter_path("  ", str(allowed))


def test_empty_name_and_bad_id():
    with pytest.raises(ValueError, match="lora_name"):
        LoRARequest("", 1, "/x")
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("a", 0, "/x")
