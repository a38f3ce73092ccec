"""The scheduler's adapter limit without a model (torch-free): at most `max_loras` distinct adapters among
running requests, base-model requests unaffected, and a request for a non-resident adapter is admitted
within a bounded number of steps even while the resident adapters keep getting new requests."""

from __future__ import annotations

import itertools

from shared_engine.config import SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request, RequestStatus
from shared_engine.core.scheduler import Scheduler
from shared_engine.sampling_params import SamplingParams

_ids = itertools.count()


def make(lora: str | None, max_tokens: int = 4) -> Request:
    return Request(f"r{next(_ids)}", [3, 4, 5, 6, 7], SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens,
                   lora_name=lora, lora_version=None if lora is None else "1:v")


def step(sched: Scheduler):
    out = sched.schedule()
    sched.update_from_output(out, {s.request_id: [9] for s in out.scheduled if s.needs_sample})
    sched.block_manager.check_integrity()
    return out


def new_scheduler(max_loras: int) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=8), BlockManager(256, 16), max_model_len=256, max_loras=max_loras)


def test_at_most_max_loras_adapters_run_and_base_passes():
    sched = new_scheduler(max_loras=2)
    requests = [make("A"), make("B"), make("C"), make(None), make("A")]
    for r in requests:
        sched.add_request(r)
    out = step(sched)
    running = {s.request.request_id for s in out.scheduled}
    # A and B take both slots; C waits; the base request behind C passes; the second A (behind C) waits too
    assert running == {requests[0].request_id, requests[1].request_id, requests[3].request_id}
    assert out.running_loras == {("A", "1:v"), ("B", "1:v")}
    assert requests[2].status is RequestStatus.WAITING and requests[4].status is RequestStatus.WAITING


def test_non_resident_adapter_is_not_starved():
    """A request for B waits while A holds the only slot, and A keeps receiving requests: B must still run."""
    sched = new_scheduler(max_loras=1)
    sched.add_request(make("A", max_tokens=6))
    step(sched)
    b = make("B")
    sched.add_request(b)
    steps = 0
    while b.status is RequestStatus.WAITING and steps < 30:
        sched.add_request(make("A", max_tokens=6))  # a steady stream for the resident adapter
        out = step(sched)
        steps += 1
        assert len(out.running_loras) <= 1
    assert b.status is not RequestStatus.WAITING, "the request for the non-resident adapter starved"
    assert steps <= 9  # admitted once the A requests admitted before it drained (max_tokens 6)


def test_without_max_loras_nothing_is_limited():
    sched = Scheduler(SchedulerConfig(max_num_seqs=8), BlockManager(256, 16), max_model_len=256)
    for name in "ABCDE":
        sched.add_request(make(name))
    out = step(sched)
    assert len(out.scheduled) == 5 and out.running_loras == frozenset()
