"""`SlotStreams`: adapter slot loads on a copy stream of their own, ordered against the steps that read the
slots on the compute stream by events, so a load need not queue behind the step in flight.

With one stream a slot load is queued after the step in flight and before the step that needs it: correct,
but the step waits for the copies and the copies for the step. On a second stream two orders must hold
for each slot, and only for that slot (device-side waits: the host never blocks):

- write after read: a load into slot s waits for the last enqueued step that read s (the evicted adapter's
  last step, possibly the one in flight); a slot no enqueued step reads is written at once, overlapping the
  step in flight;
- read after write: a step that reads s waits for s's latest load.

The runner calls `write` for each load (from `LoRAManager.prepare`), `before_step` with the step's slots
before its forward is enqueued and `after_step` once it is. Stream operations go through `StreamOps`
(`CudaStreamOps` on CUDA; the tests use a recording fake that checks both orders on every sequence).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Protocol


class StreamOps(Protocol):
    """The four stream operations `SlotStreams` needs; events are opaque."""

    def copy_stream(self) -> AbstractContextManager:
        """Context in which enqueued work goes to the copy stream."""

    def record_copy(self) -> object:
        """An event marking everything enqueued on the copy stream so far."""

    def record_compute(self) -> object:
        """An event marking everything enqueued on the compute stream so far."""

    def copy_waits(self, event: object) -> None:
        """Later copy-stream work starts after `event` (device-side)."""

    def compute_waits(self, event: object) -> None:
        """Later compute-stream work starts after `event` (device-side)."""


class SlotStreams:
    """Per-slot events: `_last_read[s]` (compute stream, after the latest enqueued step that read slot s)
    and `_pending[s]` (copy stream, after s's latest load, until a step on the compute stream waited for
    it: from then on the compute stream is ordered after it)."""

    def __init__(self, num_slots: int, ops: StreamOps) -> None:
        self.ops = ops
        self._last_read: list[object | None] = [None] * num_slots
        self._pending: list[object | None] = [None] * num_slots
        self.num_loads = 0
        self.num_loads_after_a_read = 0  # loads that had to wait for an enqueued step reading their slot

    def write(self, slot: int, enqueue: Callable[[], None]) -> None:
        """Enqueue `enqueue()` (the slot's copies) on the copy stream, after the last step that read `slot`."""
        if self._last_read[slot] is not None:
            self.ops.copy_waits(self._last_read[slot])
            self.num_loads_after_a_read += 1
        with self.ops.copy_stream():
            enqueue()
        self._pending[slot] = self.ops.record_copy()
        self.num_loads += 1

    def before_step(self, slots: Iterable[int]) -> None:
        """The step about to be enqueued reads `slots`: the compute stream waits for their pending loads."""
        for slot in set(slots):
            event = self._pending[slot]
            if event is not None:
                self.ops.compute_waits(event)
                self._pending[slot] = None

    def after_step(self, slots: Iterable[int]) -> None:
        """The step that reads `slots` is enqueued: later loads into them wait for it."""
        slots = set(slots)
        if not slots:
            return
        event = self.ops.record_compute()
        for slot in slots:
            self._last_read[slot] = event


class CudaStreamOps:
    """`StreamOps` on CUDA: the current stream computes, a stream of its own copies."""

    def __init__(self, device) -> None:
        import torch

        self._torch = torch
        self.device = device
        self.copy = torch.cuda.Stream(device=device)

    def copy_stream(self):
        return self._torch.cuda.stream(self.copy)

    def record_copy(self):
        event = self._torch.cuda.Event()
        event.record(self.copy)
        return event

    def record_compute(self):
        event = self._torch.cuda.Event()
        event.record(self._torch.cuda.current_stream(self.device))
        return event

    def copy_waits(self, event) -> None:
        self.copy.wait_event(event)

    def compute_waits(self, event) -> None:
        self._torch.cuda.current_stream(self.device).wait_event(event)
