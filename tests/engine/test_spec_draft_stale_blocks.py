"""The draft KV's validity bookkeeping (spec_decode/draft_kv_validity.py, DraftModelRunner.mirror), without a
model: a step of decodes runs no draft forward: plain decodes leave their blocks stale, speculative ones are
owed to the requests' next proposals; owed rows no proposal took turn stale at the next step or on release; a
row after a stale block of its request marks what it writes; a row that starts a fresh block (a previous
owner's stale one) makes it valid; a proposal's first position is its owed row's start or its first stale
block's. The model-level behaviour is test_spec_draft_mirror.py's."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.spec_decode.draft_kv_validity import DraftKVValidity
from shared_engine.spec_decode.draft_model_runner import DraftModelRunner


def _runner() -> DraftModelRunner:
    runner = DraftModelRunner.__new__(DraftModelRunner)  # the bookkeeping only: no model, no cache
    runner.block_size, runner.device = 4, torch.device("cpu")  # CPU: no timing events
    runner.validity = DraftKVValidity(4)
    runner.stale_blocks = runner.validity.stale_blocks
    runner.num_skipped_steps = runner.num_deferred_steps = runner.num_mirrored_tokens = runner.num_mirror_forwards = 0
    runner.forwards = []
    runner._forward = lambda inputs: runner.forwards.append(inputs.input_ids.shape[0])
    return runner


def _row(name: str, tokens: list[int], start: int, table: list[int], drafts: int = 0) -> ScheduledRequest:
    return ScheduledRequest(SimpleNamespace(request_id=name), tokens, start, table, True, num_draft_tokens=drafts)


def _step(runner: DraftModelRunner, *items: ScheduledRequest) -> None:
    out = SchedulerOutput(list(items), num_batched_tokens=sum(i.num_new_tokens for i in items),
                          num_draft_tokens=sum(i.num_draft_tokens for i in items))
    runner.mirror(SimpleNamespace(input_ids=torch.zeros(out.num_batched_tokens)), out)


def test_stale_blocks_follow_owed_rows_causality_and_fresh_blocks():
    r = _runner()
    _step(r, _row("a", [7], 5, [10, 11]), _row("b", [9], 3, [40]))
    assert (r.num_skipped_steps, r.forwards, r.stale_blocks) == (1, [], {11, 40})  # plain decodes: stale
    assert not r.validity.pending
    # a speculative step of the first request (positions 6-8): what it writes after stale block 11 is stale
    # too; no draft forward, the row owed to the request's next proposal
    _step(r, _row("a", [7, 1, 2], 6, [10, 11, 12], drafts=2))
    assert (r.num_deferred_steps, r.forwards, r.stale_blocks) == (1, [], {11, 12, 40})
    assert r.validity.pending == {"a": (6, [11, 12])}
    # no proposal took it; block 12, freed and given to a new request whose prefill chunk starts it: valid
    # again (mirrored now)
    _step(r, _row("c", [1, 2, 3, 4, 5], 4, [20, 12, 21]))
    assert r.forwards == [5] and r.num_mirror_forwards == 1
    assert r.stale_blocks == {11, 40}  # 12 and 21 written on a clean context
    # a prompt whose prefix-cache hit includes stale block 11: its new blocks are stale too
    _step(r, _row("d", [1, 2, 3], 8, [30, 11, 31]))
    assert r.stale_blocks == {11, 31, 40}
    v = r.validity
    assert v.first_stale_position([30, 11, 31], 11) == 4
    assert v.first_stale_position([30, 50], 8) is None
    assert v.first_stale_position([30, 11], 4) is None  # position 4 is not below 4 tokens


def test_first_position_takes_the_owed_row_and_release_settles_it():
    v = DraftKVValidity(4)
    # e verified positions 5-7 (2 drafts, block 51); f a plain decode at 2
    v.on_owed([_row("e", [7, 1, 2], 5, [50, 51, 52], drafts=2), _row("f", [3], 2, [60])])
    assert v.first_position("e", [50, 51, 52], 7) == 5  # 1 draft accepted: positions 5-7 owed, 7 the bonus
    assert "e" not in v.pending and not v.stale_blocks
    assert v.first_position("e", [50, 51, 52], 8) == 8  # nothing owed: the last token alone
    v.computed([50, 51, 52], 5, 7)
    v.release("f")  # finished with its row owed: its block may be in the prefix cache
    assert v.stale_blocks == {60} and not v.pending
    # a stale block before the owed row's start wins
    v.on_owed([_row("g", [4, 1], 9, [70, 71, 72], drafts=1)])
    v.stale_blocks.add(71)
    assert v.first_position("g", [70, 71, 72], 11) == 4
    v.computed([70, 71, 72], 4, 11)
    assert v.stale_blocks == {60}
    # an owed row whose blocks are no longer the request's (never expected): recomputed from there
    v.on_owed([_row("h", [4, 1], 9, [80, 81, 82], drafts=1)])
    assert v.first_position("h", [80, 90, 91], 11) == 8
    assert {82, 91} <= v.stale_blocks
