"""Speculative decodes in the scheduler, without a model: drafts spend the budget, never pass max_tokens or
max_model_len, never preempt anyone; the accepted run stops at EOS; rejected drafts rewind progress and return
their lookahead blocks; only verified tokens reach the prefix cache."""

from __future__ import annotations

from shared_engine.config import SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request
from shared_engine.core.scheduler import Scheduler
from shared_engine.sampling_params import SamplingParams


def _decoding(sched: Scheduler, rid: str, prompt_len: int, max_tokens: int = 32) -> Request:
    r = Request(rid, list(range(3, 3 + prompt_len)), SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens,
                eos_token_ids=frozenset({2}))
    sched.add_request(r)
    out = sched.schedule()
    sched.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.needs_sample})
    return r


def test_drafts_are_capped_by_max_model_len_max_tokens_and_budget():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), BlockManager(64, 4), max_model_len=40)
    near_end = _decoding(sched, "a", 36)  # 37 tokens: 3 positions left before max_model_len
    short = _decoding(sched, "b", 8, max_tokens=3)  # 1 output: 2 left
    near_end.draft_token_ids, short.draft_token_ids = [9] * 8, [9] * 8
    left = 40 - near_end.num_tokens  # positions before max_model_len ("a" also decoded while "b" was admitted)
    out = sched.schedule()
    drafts = {s.request_id: s.num_draft_tokens for s in out.scheduled}
    assert drafts == {"a": left, "b": 2} and left >= 2
    assert all(s.context_len <= 40 for s in out.scheduled)
    assert out.num_batched_tokens == 2 + left + 2 and out.num_draft_tokens == left + 2


def test_rejected_drafts_rewind_and_return_blocks_and_eos_stops_the_run():
    bm = BlockManager(32, 4, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(), bm, max_model_len=256)
    r = _decoding(sched, "a", 7)  # 8 tokens: blocks 0-1 full
    r.draft_token_ids = [20, 21, 22, 23, 24]
    out = sched.schedule()
    assert out.scheduled[0].token_ids == [7, 20, 21, 22, 23, 24] and len(bm.block_tables["a"]) == 4
    sched.update_from_output(out, {"a": [20, 30]})  # d1 accepted, d2 rejected: 30 is the recovered token
    assert r.output_token_ids == [7, 20, 30] and r.num_computed_tokens == 9
    assert len(bm.block_tables["a"]) == 3  # the lookahead block past position 9 went back
    assert bm.num_cached_blocks == 2  # blocks 0-1 (positions 0-7); block 2 also held rejected drafts' slots
    bm.check_integrity()
    r.draft_token_ids = [31, 2, 32]
    out = sched.schedule()
    sched.update_from_output(out, {"a": [31, 2, 32, 33]})  # EOS inside the accepted run
    assert r.output_token_ids == [7, 20, 30, 31, 2] and r.is_finished and r.status.value == "stop"
    bm.check_integrity()


def test_lookahead_never_preempts():
    bm = BlockManager(5, 4)
    sched = Scheduler(SchedulerConfig(), bm, max_model_len=256)
    a = _decoding(sched, "a", 7)  # 2 blocks
    b = _decoding(sched, "b", 7)  # 2 blocks; 1 left
    a.draft_token_ids = [9] * 8  # would need 2 more blocks
    out = sched.schedule()
    assert not out.preempted_request_ids and sched.num_running == 2
    assert {s.request_id: s.num_draft_tokens for s in out.scheduled}["a"] == 0
    del b
