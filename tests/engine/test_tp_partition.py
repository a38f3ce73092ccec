"""How heads, columns and the vocabulary divide among tensor-parallel ranks (distributed/partition.py):
every query head on exactly one rank, with the KV head it reads on the same rank, one GQA group size per
rank, near-equal shares, and KV heads replicated only when there are fewer than ranks; the step message
rank 0 sends the other ranks (distributed/step_message.py) keeps every scheduled field."""

from __future__ import annotations

import pytest

from shared_engine.config import EngineConfig
from shared_engine.distributed.partition import (
    head_partition,
    max_local_kv_heads,
    padded_vocab_size,
    split_range,
)

SHAPES = [(9, 3), (32, 8), (64, 8), (4, 2), (8, 1), (14, 2), (12, 12), (40, 8)]


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), SHAPES)
@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_every_query_head_once_with_its_kv_head(num_heads, num_kv_heads, tp):
    if tp > num_heads:
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            head_partition(num_heads, num_kv_heads, tp, 0)
        return
    group = num_heads // num_kv_heads
    parts = [head_partition(num_heads, num_kv_heads, tp, r) for r in range(tp)]
    assert [p.q_start for p in parts] == [0] + [p.q_end for p in parts[:-1]] and parts[-1].q_end == num_heads
    for p in parts:
        assert p.num_heads >= 1 and p.num_kv_heads >= 1
        kv_of = [h // group for h in range(p.q_start, p.q_end)]
        assert set(kv_of) == set(range(p.kv_start, p.kv_end))  # holds exactly the KV heads it reads
        assert p.num_heads % p.num_kv_heads == 0  # one group size on the rank: plain GQA
    if num_kv_heads >= tp:  # no replication, KV heads near-equal
        assert sum(p.num_kv_heads for p in parts) == num_kv_heads
        assert max(p.num_kv_heads for p in parts) - min(p.num_kv_heads for p in parts) <= 1
    else:
        assert all(p.num_kv_heads == 1 for p in parts)
        assert {p.kv_start for p in parts} == set(range(num_kv_heads))  # every KV head somewhere


def test_default_model_at_tp2_splits_kv_groups():
    # SmolLM2-135M: 9 query / 3 KV heads. Rank 0: KV 0-1 with queries 0-5; rank 1: KV 2 with queries 6-8.
    assert [(p.q_start, p.q_end, p.kv_start, p.kv_end) for p in
            (head_partition(9, 3, 2, r) for r in range(2))] == [(0, 6, 0, 2), (6, 9, 2, 3)]
    assert max_local_kv_heads(9, 3, 2) == 2
    # TP=4 (more ranks than KV heads): ranks 0-1 share KV head 0, its 3 queries split 2 / 1
    assert [(p.q_start, p.q_end, p.kv_start) for p in
            (head_partition(9, 3, 4, r) for r in range(4))] == [(0, 2, 0), (2, 3, 0), (3, 6, 1), (6, 9, 2)]


def test_split_range_and_vocab_padding():
    assert [split_range(10, 3, i) for i in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert padded_vocab_size(49152, 2) == 49152 and padded_vocab_size(128257, 4) == 128260


def test_tensor_parallel_size_is_one_setting_everywhere():
    assert EngineConfig.from_flat(tensor_parallel_size=2).parallel.tensor_parallel_size == 2
    assert EngineConfig().to_flat()["tensor_parallel_size"] == 1
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig.from_flat(tensor_parallel_size=0)


def test_step_message_round_trip_keeps_every_field():
    import pickle

    from shared_engine.core.request import Request
    from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
    from shared_engine.distributed.step_message import decode, encode
    from shared_engine.sampling_params import SamplingParams

    plain = Request("a", [1, 2, 3], SamplingParams(max_tokens=4), max_tokens=4)
    scored = Request("b", [4, 5, 6, 7], SamplingParams(max_tokens=4, prompt_logprobs=2), max_tokens=4)
    items = [ScheduledRequest(plain, [9], 3, [0], True), ScheduledRequest(scored, [4, 5], 0, [1, 2], False)]
    out = SchedulerOutput(items, preempted_request_ids=["c"], num_batched_tokens=3)
    got = decode(pickle.loads(pickle.dumps(encode(out))))
    assert (got.num_batched_tokens, got.preempted_request_ids) == (3, ["c"])
    for mine, theirs in zip(got.scheduled, out.scheduled, strict=True):
        assert (mine.token_ids, mine.start_position, mine.block_table, mine.needs_sample) == (
            theirs.token_ids, theirs.start_position, theirs.block_table, theirs.needs_sample)
        assert mine.request.request_id == theirs.request_id
        assert mine.request.num_prompt_tokens == theirs.request.num_prompt_tokens
    first = got.scheduled[0].request
    assert first.prompt_token_ids == [] and first.sampling_params.prompt_logprobs is None
    assert got.scheduled[1].request.prompt_token_ids == [4, 5, 6, 7]
    assert got.scheduled[1].request.sampling_params.prompt_logprobs == 2
