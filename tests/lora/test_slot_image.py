"""`SlotImage`: the CPU cache's adapters packed in the model's dtype, as the GPU slots hold them, with the
values the old per-load conversion wrote (the same rounding of the same fp32 tensors)."""

from __future__ import annotations

import pytest
import torch

from shared_engine.lora.peft_adapter import LoRAAdapter
from shared_engine.lora.slot_image import make_slot_image


def _adapter() -> LoRAAdapter:
    g = torch.Generator().manual_seed(0)
    adapter = LoRAAdapter("a", rank=4, scaling=2.0, target_modules=("o_proj", "q_proj"))
    for key, (fan_in, fan_out) in {(0, "q_proj"): (48, 64), (1, "q_proj"): (48, 64), (1, "o_proj"): (64, 48)}.items():
        adapter.weights[key] = (torch.randn(4, fan_in, generator=g), torch.randn(fan_out, 4, generator=g) * 3)
    return adapter


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_image_holds_the_converted_weights_in_one_buffer(dtype):
    adapter = _adapter()
    image = make_slot_image(adapter, dtype, pin=False)
    assert (image.name, image.rank) == ("a", 4)
    assert set(image.parts) == set(adapter.weights)
    assert image.num_bytes == sum(a.numel() + b.numel() for a, b in adapter.weights.values()) * dtype.itemsize
    start, end = image.buffer.data_ptr(), image.buffer.data_ptr() + image.num_bytes
    for key, (a, b) in adapter.weights.items():
        a_img, bt_img = image.parts[key]
        # what the old path copied into the slot: t.to(dtype) of A, and of B before its transpose
        assert a_img.dtype == bt_img.dtype == dtype
        assert torch.equal(a_img, a.to(dtype)) and torch.equal(bt_img, b.to(dtype).t())
        assert a_img.is_contiguous() and bt_img.is_contiguous()  # one plain copy each into the slot
        assert start <= a_img.data_ptr() < end and start <= bt_img.data_ptr() < end
    if dtype != torch.float32:  # the rounding is real: the test would see a wrong dtype or a skipped cast
        a, _ = adapter.weights[(0, "q_proj")]
        assert not torch.equal(image.parts[(0, "q_proj")][0].float(), a)


def test_image_does_not_alias_the_adapter():
    adapter = _adapter()
    image = make_slot_image(adapter, torch.float32, pin=False)
    a, _ = adapter.weights[(0, "q_proj")]
    before = image.parts[(0, "q_proj")][0].clone()
    a.add_(1.0)  # the fp32 tensors may be dropped or changed: the image is a copy
    assert torch.equal(image.parts[(0, "q_proj")][0], before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_image_is_pinned_for_a_cuda_model():
    assert make_slot_image(_adapter(), torch.bfloat16, pin=True).buffer.is_pinned()
