"""Small per-step host values (row indices, temperatures, token ids) as device tensors, without waiting for
the device: on CUDA they are built in pinned memory and copied asynchronously, so the sampler can enqueue a
step's sampling behind its forward pass (async output processing). A copy from pageable memory, or a
Python list used as an index, makes torch wait for the stream instead."""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` (a flat list) as a `[len(values)]` tensor of `dtype` on `device`; never synchronises. The
    pinned source stays reserved until its copy has run (torch's caching host allocator records it)."""
    pinned = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=pinned)
