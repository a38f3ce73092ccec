"""`SlotStreams`: slot loads on a copy stream, ordered by events against the steps that read the slots.

A fake pair of streams records every enqueued operation, event and wait; from them the checker derives
which operation the device must run before which (program order per stream, record -> wait edges) and
asserts, for every slot, that each step reading it runs after its latest load (read after write) and each
load after every earlier step that read its slot (write after read). Random sequences of loads and steps
check the ordering logic; the same check runs over a real engine's steps on the CPU, whose outputs must not
change. Two broken variants (no copy-stream wait, no compute-stream wait) show the checker catches both."""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest

from shared_engine.lora.slot_streams import SlotStreams


class FakeStreams:
    """Two recorded streams. `log`: (stream, kind, payload) in host order; an event is (stream, ops enqueued
    on that stream when it was recorded)."""

    def __init__(self) -> None:
        self.current = "compute"
        self.count = {"compute": 0, "copy": 0}
        self.log: list[tuple[str, str, object]] = []

    def op(self, kind: str, payload=None) -> None:
        self.log.append((self.current, kind, payload))
        self.count[self.current] += 1

    @contextmanager
    def copy_stream(self):
        previous, self.current = self.current, "copy"
        try:
            yield
        finally:
            self.current = previous

    def record_copy(self):
        return ("copy", self.count["copy"])

    def record_compute(self):
        return ("compute", self.count["compute"])

    def copy_waits(self, event) -> None:
        self.log.append(("copy", "wait", event))
        self.count["copy"] += 1

    def compute_waits(self, event) -> None:
        self.log.append(("compute", "wait", event))
        self.count["compute"] += 1


class RecordingSlotStreams(SlotStreams):
    """Logs each load's copies and each step's reads as operations on the fake streams."""

    def write(self, slot, enqueue) -> None:
        super().write(slot, lambda: (self.ops.op("write", slot), enqueue()))

    def after_step(self, slots) -> None:
        slots = set(slots)
        if slots:
            self.ops.op("read", slots)  # the step's forward ran on the compute stream since before_step
        super().after_step(slots)


def violations(log) -> list[str]:
    """Ordering violations in a fake-stream log (empty: both orders hold for every slot)."""
    nodes, position = [], {"compute": 0, "copy": 0}
    for stream, kind, payload in log:
        nodes.append((stream, position[stream], kind, payload))
        position[stream] += 1
    index = {(s, i): n for n, (s, i, _, _) in enumerate(nodes)}
    preds = {n: [] for n in range(len(nodes))}
    for n, (stream, i, kind, payload) in enumerate(nodes):
        if i > 0:
            preds[n].append(index[(stream, i - 1)])
        if kind == "wait" and payload[1] > 0:  # after the last op enqueued before the event was recorded
            preds[n].append(index[(payload[0], payload[1] - 1)])

    def before(a: int, b: int) -> bool:  # the device runs a before b
        seen, todo = set(), [b]
        while todo:
            for p in preds[todo.pop()]:
                if p == a:
                    return True
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
        return False

    found = []
    for n, (_, _, kind, payload) in enumerate(nodes):
        if kind == "read":
            for slot in payload:
                writes = [m for m in range(n) if nodes[m][2] == "write" and nodes[m][3] == slot]
                if writes and not before(writes[-1], n):
                    found.append(f"step {n} reads slot {slot} before its load {writes[-1]}")
        if kind == "write":
            for m in range(n):
                if nodes[m][2] == "read" and payload in nodes[m][3] and not before(m, n):
                    found.append(f"load {n} into slot {payload} may overwrite it under step {m}")
    return found


def run_sequence(streams: SlotStreams, rng: random.Random, num_slots: int, length: int) -> None:
    for _ in range(length):
        if rng.random() < 0.4:
            streams.write(rng.randrange(num_slots), lambda: None)
        else:
            slots = set(rng.sample(range(num_slots), rng.randint(0, num_slots)))
            streams.before_step(slots)
            streams.after_step(slots)


def test_random_sequences_keep_both_orders_per_slot():
    for seed in range(150):
        fake = FakeStreams()
        streams = RecordingSlotStreams(4, fake)
        run_sequence(streams, random.Random(seed), 4, 30)
        assert violations(fake.log) == [], seed
    assert streams.num_loads > 0


def test_load_into_a_slot_no_enqueued_step_reads_does_not_wait():
    fake = FakeStreams()
    streams = RecordingSlotStreams(3, fake)
    streams.before_step({0})
    streams.after_step({0})  # the step in flight reads slot 0 only
    streams.write(1, lambda: None)  # free slot: overlaps that step
    streams.write(0, lambda: None)  # the slot it reads: waits for it
    waits = [(stream, payload) for stream, kind, payload in fake.log if kind == "wait"]
    assert waits == [("copy", ("compute", 1))]
    assert (streams.num_loads, streams.num_loads_after_a_read) == (2, 1)
    streams.before_step({0, 1})  # the next step waits for both loads (copy ops: write | wait, write), once each
    assert sorted(p for s, k, p in fake.log if k == "wait" and s == "compute") == [("copy", 1), ("copy", 3)]
    streams.after_step({0, 1})
    streams.before_step({0, 1})  # already ordered: no new wait
    assert sum(1 for s, k, _ in fake.log if k == "wait" and s == "compute") == 2


class NoCopyWait(RecordingSlotStreams):
    def write(self, slot, enqueue) -> None:
        self._last_read[slot] = None  # forgets the readers: a load may overwrite a slot under a running step
        super().write(slot, enqueue)


class NoComputeWait(RecordingSlotStreams):
    def before_step(self, slots) -> None:  # a step may read a slot whose load has not finished
        pass


@pytest.mark.parametrize("broken, message", [(NoCopyWait, "overwrite"), (NoComputeWait, "before its load")])
def test_the_checker_catches_a_missing_wait(broken, message):
    found = []
    for seed in range(20):
        fake = FakeStreams()
        run_sequence(broken(4, fake), random.Random(seed), 4, 30)
        found += violations(fake.log)
    assert any(message in v for v in found)


def test_engine_steps_keep_both_orders_and_outputs(adapter_dirs):
    """A real engine (CPU, 2 slots for 3 adapters: loads between steps) through the recording streams: the
    greedy outputs equal the same engine's without them, and every load and step is ordered."""
    from shared_engine import LLM, LoRARequest, SamplingParams

    llm = LLM(kv_cache_memory=32 * 2**20, max_model_len=256, enable_lora=True, max_loras=2, max_cpu_loras=3,
              max_lora_rank=16)
    manager = llm.engine.runner.lora
    params = SamplingParams(temperature=0.0, max_tokens=6)
    prompts = [[1, 17, 300, 42, 9]] * 4
    names = ["qv8", "all16", "mlp4"]

    def loras(first_id: int):
        return [None, *(LoRARequest(n, first_id + i, str(adapter_dirs[n])) for i, n in enumerate(names))]

    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, lora_request=loras(1))]
    fake = FakeStreams()
    manager.streams = RecordingSlotStreams(2, fake)
    ordered = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, lora_request=loras(11))]
    assert ordered == plain
    assert manager.streams.num_loads >= 3  # three new adapters through two slots
    assert any(kind == "read" for _, kind, _ in fake.log)
    assert violations(fake.log) == []
