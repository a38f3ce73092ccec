"""Scheduler decisions without a model: budget, decode-first order, chunking, preemption victim."""

from __future__ import annotations

from shared_engine.config import SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request, RequestStatus
from shared_engine.core.scheduler import Scheduler
from shared_engine.sampling_params import SamplingParams


def make(rid: str, prompt_len: int, max_tokens: int = 8) -> Request:
    return Request(rid, list(range(3, 3 + prompt_len)), SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens)


def run_step(sched: Scheduler, token: int = 7):
    out = sched.schedule()
    sampled = {s.request_id: [token] for s in out.scheduled if s.needs_sample}
    sched.update_from_output(out, sampled)
    sched.block_manager.check_integrity()
    return out


def test_chunked_prefill_then_decode_first():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=32), BlockManager(64, 16), max_model_len=256)
    sched.add_request(make("a", 40))
    out = run_step(sched)
    assert [(s.request_id, s.num_new_tokens, s.needs_sample) for s in out.scheduled] == [("a", 32, False)]
    sched.add_request(make("b", 50))
    out = run_step(sched)  # a finishes its prompt (8), b gets the remaining 24
    assert [(s.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 8), ("b", 24)]
    out = run_step(sched)  # a decodes first, then b's next chunk
    assert [(s.request_id, s.num_new_tokens, s.is_decode) for s in out.scheduled] == [("a", 1, True), ("b", 26, False)]
    assert out.num_batched_tokens == 27


def test_max_num_seqs_caps_the_batch():
    sched = Scheduler(SchedulerConfig(max_num_seqs=2), BlockManager(64, 16), max_model_len=256)
    for i in range(4):
        sched.add_request(make(f"r{i}", 5))
    out = run_step(sched)
    assert [s.request_id for s in out.scheduled] == ["r0", "r1"]
    assert sched.num_waiting == 2


def test_preempts_most_recent_arrival_and_recomputes():
    # 4 blocks of 4 tokens; two requests of 7 prompt tokens each need 2 blocks, then grow
    sched = Scheduler(SchedulerConfig(), BlockManager(4, 4), max_model_len=16)
    old, new = make("old", 7, max_tokens=8), make("new", 7, max_tokens=8)
    sched.add_request(old)
    sched.add_request(new)
    run_step(sched)  # both prefill: 4 blocks used, 8 tokens of KV each fit exactly after one decode
    run_step(sched)  # each decode writes position 7 (still within block 2)
    out = run_step(sched)  # position 8 needs a third block each: the newest is preempted
    assert out.preempted_request_ids == ["new"]
    assert new.status is RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert new.num_output_tokens == 2  # generated tokens are kept for recompute
    assert sched.waiting[0] is new
    assert sched.num_preemptions_total == 1


def test_abort_frees_blocks():
    bm = BlockManager(16, 4)
    sched = Scheduler(SchedulerConfig(), bm, max_model_len=64)
    sched.add_request(make("a", 10))
    run_step(sched)
    assert bm.num_free_blocks < 16
    sched.abort_request("a")
    assert bm.num_free_blocks == 16 and not sched.has_unfinished_requests()
    bm.check_integrity()
