"""`KVOffloader`: moves KV blocks between the paged GPU cache and a host buffer (`--kv-offload-size`).

The block manager decides (core/host_kv_tier.py); this runs a step's copies, `SchedulerOutput.kv_offloads`
[(gpu block, host slot)] then `kv_restores` [(host slot, gpu block)], before the step's forward:

- CUDA: on a side stream, into and out of a pinned host buffer. The side stream first waits for everything
  enqueued on the compute stream so far (the blocks it offloads were written by earlier steps), and the
  compute stream waits for the side stream's event before anything it enqueues next (the forward reads
  restored blocks and overwrites evicted ones). The host's work between launch and forward (input building,
  the CUDA-graph pick) overlaps the copies; the forward itself waits for them.
- CPU: the same copies, done synchronously.

Each copy gathers up to `chunk` blocks of every layer into one device staging buffer and moves runs of
consecutive host slots with one copy each (a copy per block per layer would be thousands of small copies for
a 60k-token prefix). Bytes are copied, never converted: a restored block is bit-identical to the offloaded one.
"""

from __future__ import annotations

import torch

STAGING_BYTES = 64 * 1024**2  # device staging buffer: copies go in chunks of this many bytes of blocks


class KVOffloader:
    def __init__(self, kv_caches: list[torch.Tensor], num_host_blocks: int) -> None:
        """`kv_caches`: per layer `[2, num_blocks, block_size, num_kv_heads, head_dim]` (the model runner's).
        Allocates the host buffer `[num_host_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]`
        (pinned on CUDA) and the device staging buffer. Raises `ValueError` for `num_host_blocks` < 1."""
        if num_host_blocks < 1:
            raise ValueError(f"num_host_blocks must be >= 1, got {num_host_blocks}")
        first = kv_caches[0]
        self.kv_caches = kv_caches
        self.device = first.device
        block_shape = (len(kv_caches), 2, *first.shape[2:])  # [num_layers, 2, block_size, heads, head_dim]
        cuda = self.device.type == "cuda"
        # empty, not zeros: a slot is read only after an offload wrote it, and touching tens of GiB of pinned
        # pages at start-up costs seconds
        self.host = torch.empty((num_host_blocks, *block_shape), dtype=first.dtype, pin_memory=cuda)
        self.chunk = max(1, min(num_host_blocks, STAGING_BYTES // self.block_bytes(block_shape, first.dtype)))
        self.staging = torch.empty((self.chunk, *block_shape), dtype=first.dtype, device=self.device)
        self.stream = torch.cuda.Stream(self.device) if cuda else None

    @staticmethod
    def block_bytes(block_shape, dtype: torch.dtype) -> int:
        n = 1
        for size in block_shape:
            n *= size
        return n * torch.empty((), dtype=dtype).element_size()

    @torch.inference_mode()
    def run(self, offloads: list[tuple[int, int]], restores: list[tuple[int, int]]) -> None:
        """Enqueue (CUDA) or run (CPU) the step's copies: every offload, then every restore."""
        if not offloads and not restores:
            return
        if self.stream is None:
            self._copy(offloads, restores)
            return
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            self._copy(offloads, restores)
        compute.wait_stream(self.stream)

    def _copy(self, offloads, restores) -> None:
        for start in range(0, len(offloads), self.chunk):
            self._offload(offloads[start:start + self.chunk])
        for start in range(0, len(restores), self.chunk):
            self._restore(restores[start:start + self.chunk])

    def _offload(self, pairs: list[tuple[int, int]]) -> None:
        n = len(pairs)
        blocks = torch.tensor([b for b, _ in pairs], dtype=torch.long).to(self.device, non_blocking=True)
        for layer, cache in enumerate(self.kv_caches):
            raw = torch.uint8 if cache.dtype == torch.float8_e4m3fn else cache.dtype  # FP8: as bytes (see below)
            picked = cache.view(raw).index_select(1, blocks).transpose(0, 1)  # [n, 2, bs, h, d]
            self.staging[:n, layer].view(raw).copy_(picked)
        for slot, row, length in _runs([s for _, s in pairs]):
            self.host[slot:slot + length].copy_(self.staging[row:row + length], non_blocking=True)

    def _restore(self, pairs: list[tuple[int, int]]) -> None:
        n = len(pairs)
        for slot, row, length in _runs([s for s, _ in pairs]):
            self.staging[row:row + length].copy_(self.host[slot:slot + length], non_blocking=True)
        blocks = torch.tensor([b for _, b in pairs], dtype=torch.long).to(self.device, non_blocking=True)
        for layer, cache in enumerate(self.kv_caches):
            # an FP8 cache through uint8 views (the CPU has no fp8 index_copy_; the bytes are the same)
            raw = torch.uint8 if cache.dtype == torch.float8_e4m3fn else cache.dtype
            cache.view(raw).index_copy_(1, blocks, self.staging[:n, layer].transpose(0, 1).view(raw))


def _runs(slots: list[int]):
    """`(first slot, first row, length)` of each run of consecutive host slots in `slots` (row = position)."""
    row = 0
    while row < len(slots):
        end = row + 1
        while end < len(slots) and slots[end] == slots[end - 1] + 1:
            end += 1
        yield slots[row], row, end - row
        row = end
