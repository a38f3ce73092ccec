"""The draft KV mirror's stale-block bookkeeping (DraftModelRunner.mirror), without a model: a plain-decode step
is skipped and its blocks marked stale; a mirrored row after a stale block of its request marks what it writes;
a row that starts a fresh block (a previous owner's stale one) makes it valid; the first stale position is a
block start. The model-level behaviour is test_spec_draft_mirror.py's."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.spec_decode.draft_model_runner import DraftModelRunner


def _runner() -> DraftModelRunner:
    runner = DraftModelRunner.__new__(DraftModelRunner)  # the bookkeeping only: no model, no cache
    runner.block_size, runner.stale_blocks, runner.device = 4, set(), torch.device("cpu")  # CPU: no timing events
    runner.num_skipped_steps = runner.num_mirrored_tokens = 0
    runner.forwards = []
    runner._forward = lambda inputs: runner.forwards.append(inputs.input_ids.shape[0])
    return runner


def _step(runner: DraftModelRunner, *items: ScheduledRequest) -> None:
    out = SchedulerOutput(list(items), num_batched_tokens=sum(i.num_new_tokens for i in items),
                          num_draft_tokens=sum(i.num_draft_tokens for i in items))
    runner.mirror(SimpleNamespace(input_ids=torch.zeros(out.num_batched_tokens)), out)


def test_stale_blocks_follow_skips_causality_and_fresh_blocks():
    r = _runner()
    _step(r, ScheduledRequest(None, [7], 5, [10, 11], True), ScheduledRequest(None, [9], 3, [40], True))
    assert (r.num_skipped_steps, r.forwards, r.stale_blocks) == (1, [], {11, 40})  # plain decodes: skipped
    # a speculative step of the first request (positions 6-8) sees stale block 11: what it writes is stale
    _step(r, ScheduledRequest(None, [7, 1, 2], 6, [10, 11, 12], True, num_draft_tokens=2))
    assert r.forwards == [3] and r.stale_blocks == {11, 12, 40}
    # block 12, freed and given to a new request whose prefill chunk starts it: valid again
    _step(r, ScheduledRequest(None, [1, 2, 3, 4, 5], 4, [20, 12, 21], True))
    assert r.stale_blocks == {11, 40}  # 12 and 21 written on a clean context
    # a prompt whose prefix-cache hit includes stale block 11: its new blocks are stale too
    _step(r, ScheduledRequest(None, [1, 2, 3], 8, [30, 11, 31], True))
    assert r.stale_blocks == {11, 31, 40}
    assert r._first_stale_position([30, 11, 31], 11) == 4
    assert r._first_stale_position([30, 50], 8) is None
    assert r._first_stale_position([30, 11], 4) is None  # position 4 is not below 4 tokens
