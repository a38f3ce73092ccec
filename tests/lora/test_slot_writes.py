"""`LoRAProjection.write_slot` writes only what changes (rows a larger previous rank left, the slot's rank when
it differs, the new adapter's rows) and leaves the buffers exactly as a full rewrite of every slot would."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from shared_engine.model_executor.layers.lora import LoRAContext, LoRAProjection

IN, OUTS, SLOTS, MAX_RANK = 24, [16, 8, 8], 3, 8


def projection() -> LoRAProjection:
    ctx = LoRAContext(max_num_tokens=8, max_loras=SLOTS, dtype=torch.float32, device=torch.device("cpu"))
    return LoRAProjection(ctx, IN, OUTS, MAX_RANK, torch.float32, torch.device("cpu"))


def full_rewrite(latest: dict) -> LoRAProjection:
    """The buffers from zero with every slot's latest write applied in full (the old behaviour)."""
    p = projection()
    width = SLOTS * MAX_RANK
    for (slot, i), (a, b) in latest.items():
        if a is not None:
            r = a.shape[0]
            p.lora_a[i * width + slot * MAX_RANK : i * width + slot * MAX_RANK + r] = a
            p.lora_b(i)[slot * MAX_RANK : slot * MAX_RANK + r] = b.t()
            p.slot_ranks[i, slot] = r
    return p


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def test_random_writes_equal_a_full_rewrite():
    rng = random.Random(0)
    p, latest = projection(), {}
    for step in range(120):
        slot, i, rank = rng.randrange(SLOTS), rng.randrange(len(OUTS)), rng.choice([None, 1, 3, 8])
        if rank is None:
            a = b = None
        else:
            a, b = torch.randn(rank, IN), torch.randn(OUTS[i], rank)
        p.write_slot(slot, i, a, b)
        latest[(slot, i)] = (a, b)
        want = full_rewrite(latest)
        assert torch.equal(p.lora_a, want.lora_a), step
        assert torch.equal(p.lora_b_all, want.lora_b_all), step
        assert torch.equal(p.slot_ranks, want.slot_ranks), step


def test_reloading_the_same_shapes_is_two_copies_per_slice():
    p = projection()
    a, b = torch.randn(4, IN), torch.randn(OUTS[0], 4)
    p.write_slot(1, 0, a, b)
    p.write_slot(1, 2, None, None)
    with CountOps() as same:
        p.write_slot(1, 0, a * 2, b * 2)  # another adapter of rank 4 into the slot
        p.write_slot(1, 2, None, None)  # still untargeted: already zero
    assert same.counts["zero_"] == 0 and same.counts["copy_"] == 2  # no zeroing, no rank write
    with CountOps() as smaller:
        p.write_slot(1, 0, a[:2], b[:, :2])  # rank 4 -> 2: rows 2-3 zeroed in A and B, rank written
    assert smaller.counts["zero_"] == 2 and smaller.counts["copy_"] == 3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batched_slot_loads_equal_per_slice_writes(tiny_model_dir, tmp_path, device):
    """The CUDA slot load (one host-to-device copy of the image, two foreach copies) leaves every LoRA
    buffer exactly as the per-slice `write_slot` path, over a random sequence of adapters of different ranks
    and targets (larger ranks replaced by smaller: rows zeroed), and issues two copies for the rows. On CUDA
    (gpu-marked) from pinned images, as the engine runs it."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from shared_engine.config.lora_config import LoRAConfig
    from shared_engine.lora.adapter_factory import write_random_adapter
    from shared_engine.lora.lora_manager import LoRAManager, load_checked
    from shared_engine.lora.lora_request import LoRARequest
    from shared_engine.lora.slot_image import make_slot_image
    from shared_engine.model_arch import ModelArch
    from shared_engine.model_executor.models.registry import get_model_class

    arch = ModelArch.from_dir(tiny_model_dir)
    config = LoRAConfig(enable_lora=True, max_loras=3, max_lora_rank=8)
    managers = []
    for batched in (True, False):
        torch.manual_seed(0)
        with torch.device(device):
            model = get_model_class(arch.architecture)(arch, max_position=64)
        manager = LoRAManager(model, config, arch, max_num_tokens=16)
        manager.batched = batched
        managers.append(manager)
    targets = [["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
               ["o_proj", "down_proj"], ["k_proj"]]
    images = []
    for i, (rank, modules) in enumerate(zip([8, 2, 4, 8], targets)):
        path = write_random_adapter(tmp_path / f"a{i}", arch, rank, modules, seed=i, lora_alpha=rank)
        images.append(make_slot_image(load_checked(LoRARequest(f"a{i}", i + 1, str(path)), arch, config),
                                      torch.float32, pin=device == "cuda"))
    rng = random.Random(1)
    for step in range(12):
        slot, image = rng.randrange(3), rng.choice(images)
        with CountOps() as ops:
            managers[0]._write_slot(slot, image)
        managers[1]._write_slot(slot, image)
        # two copies for the adapter's rows; a copy more only where a slice's rank changes (slot_ranks)
        if device == "cpu":  # (on CUDA the image's one host-to-device copy is a copy_ too)
            assert ops.counts["_foreach_copy_"] == 2 and ops.counts["copy_"] == ops.counts["lift_fresh"], ops.counts
        for (name, got), want in zip(managers[0].model.named_buffers(), managers[1].model.buffers()):
            if "lora" in name or "slot_ranks" in name:
                assert torch.equal(got, want), (step, name)
