"""`SlotImage`: an adapter in the CPU cache as a GPU slot holds it, so that loading a slot is plain copies.

Before, the CPU cache held each adapter in fp32 and every slot load converted each tensor to the model's
dtype on the host and copied it from pageable memory (`t.to(device, dtype, non_blocking=True)`), 256
copies for a rank-16 q/k/v/o adapter of llama-3.1-8b (H200, 284c523: 31-34 ms per load, synchronised).
A copy from pageable memory is staged by the driver, which "may synchronize with the stream" (CUDA's API
synchronisation notes; copies of more than 64 KB, such as that adapter's 128 KB bf16 A tensors, are the
ones not buffered): then each copy waits for the step in flight. Not profiled on a GPU. Here the
conversion happens once, when the adapter enters the CPU cache: every A [r, in] and B transposed and
scaled [r, out] in the model's dtype, packed in one host buffer that is pinned when the model is on CUDA,
so a slot load is asynchronous host-to-device copies (PyTorch's pinned-memory allocator keeps the buffer
until the copies that read it have finished, even if the adapter leaves the cache meanwhile).

The values are those the old path wrote: the same rounding of the same fp32 tensors to the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared_engine.lora.peft_adapter import LoRAAdapter


@dataclass
class SlotImage:
    """`parts[(layer, module)] = (A [rank, in], B_scaled^T [rank, out])`, contiguous views of `buffer` (one
    flat host tensor in the model's dtype; pinned for a CUDA model). Modules the adapter does not target are
    absent. `name`, `rank`: the adapter's."""

    name: str
    rank: int
    buffer: torch.Tensor
    parts: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def num_bytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def make_slot_image(adapter: LoRAAdapter, dtype: torch.dtype, pin: bool) -> SlotImage:
    """Pack `adapter`'s weights (fp32 on the CPU) into one host buffer of `dtype`, pinned if `pin` (needs
    CUDA). Raises RuntimeError from torch when pinning is asked without CUDA."""
    sizes = [a.numel() + b.numel() for a, b in adapter.weights.values()]
    buffer = torch.empty(sum(sizes), dtype=dtype, pin_memory=pin)
    image = SlotImage(adapter.name, adapter.rank, buffer)
    offset = 0
    for (key, (a, b)), size in zip(adapter.weights.items(), sizes):
        a_view = buffer[offset : offset + a.numel()].view(a.shape)
        bt_view = buffer[offset + a.numel() : offset + size].view(b.shape[1], b.shape[0])
        a_view.copy_(a)
        bt_view.copy_(b.t())
        image.parts[key] = (a_view, bt_view)
        offset += size
    return image
