"""The case's session trace: Mooncake's fields and block-hash semantics, the committed CPU trace against its
prompt texts (token counts, hash ids, every turn a prefix of the next), the generator's determinism, and the
synthetic token ids that the simulator replays."""

from __future__ import annotations

import json
import math

import pytest

from case_coding_agent.loadtest.make_trace import TRACES
from case_coding_agent.loadtest.session_gen import Profile, Range, SessionGenerator, load_profile
from case_coding_agent.loadtest.trace import (
    BlockHasher,
    TraceRecord,
    read_trace,
    sessions,
    synthetic_token_ids,
    write_trace,
)

CPU_TRACE = TRACES / "cpu" / "trace.jsonl"
H200_TRACE = TRACES / "h200" / "trace.jsonl"


@pytest.fixture(scope="module")
def tokenizer():
    from case_coding_agent.loadtest.make_trace import default_tokenizer

    return default_tokenizer()


def test_block_hashes_are_chained_and_first_seen_numbered():
    h = BlockHasher(4)
    a = h.hash_ids([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert a == [0, 1, 2]  # two full blocks and a partial one
    assert h.hash_ids([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == [0, 1, 3]  # the longer partial block differs
    assert h.hash_ids([9, 9, 9, 9, 5, 6, 7, 8]) == [4, 5]  # same second block, other prefix: other id
    with pytest.raises(ValueError, match="block_tokens"):
        BlockHasher(0)


def test_committed_cpu_trace_matches_its_prompts(tokenizer):
    header, records = read_trace(CPU_TRACE)
    assert header["format"] == "mooncake" and header["block_tokens"] == 64
    lines = (CPU_TRACE.parent / "prompts.jsonl").read_text().splitlines()
    rows = {r["request_id"]: r for r in map(json.loads, lines)}
    hasher = BlockHasher(header["block_tokens"])
    previous_ids: dict[str, list[int]] = {}
    for session_id, turns in sessions(records).items():
        text = ""
        for r in turns:
            text += rows[r.request_id]["append"]
            ids = tokenizer.encode(text, add_special_tokens=False).ids  # what the engine tokenises
            assert len(ids) == r.input_length, r.request_id
            assert len(r.hash_ids) == math.ceil(r.input_length / 64)
            if r.turn > 1:
                assert ids[:len(previous_ids[session_id])] == previous_ids[session_id], r.request_id
            previous_ids[session_id] = ids
    by_id = {r.request_id: r for r in records}
    texts: dict[str, str] = {}
    for request_id, row in rows.items():  # ids are numbered in generation order (the prompts file's)
        texts[row["session_id"]] = texts.get(row["session_id"], "") + row["append"]
        ids = tokenizer.encode(texts[row["session_id"]], add_special_tokens=False).ids
        assert hasher.hash_ids(ids) == by_id[request_id].hash_ids, request_id


def test_traces_have_the_briefs_shape():
    _, cpu = read_trace(CPU_TRACE)
    assert all(isinstance(r.timestamp, int) for r in cpu)
    _, h200 = read_trace(H200_TRACE)
    by_session = sessions(h200)
    warm = [t for s, t in by_session.items() if not s.startswith("cold")]
    assert len(warm) == 16 and all(20 <= len(t) <= 40 for t in warm)
    assert max(t[-1].input_length for t in warm) > 55000
    cold = [t[0] for s, t in by_session.items() if s.startswith("cold")]
    assert cold and all(r.input_length > 55000 for r in cold)
    ratio = sum(r.input_length for r in h200) / sum(r.output_length for r in h200)
    assert ratio > 100, ratio  # input:output above 100:1
    for turns in by_session.values():  # every turn shares all but its last block with the next
        for a, b in zip(turns, turns[1:]):
            assert b.hash_ids[:len(a.hash_ids) - 1] == a.hash_ids[:-1] and b.timestamp > a.timestamp


def test_generator_is_deterministic_and_respects_the_context_cap(tokenizer, tmp_path):
    tiny = Profile(name="tiny", block_tokens=16, sessions=2, stagger_s=1, turns=Range(3, 3), system_tokens=200,
                   tool_output_tokens=Range(50, 80), output_tokens=Range(4, 6), pause_s=Range(1, 2),
                   cold_sessions={"count": 1, "first_at_s": 2, "every_s": 0, "first_turn_tokens": 400, "turns": 2},
                   max_context_tokens=700, seed=3)
    one = SessionGenerator(tiny, tokenizer).generate()
    two = SessionGenerator(tiny, tokenizer).generate()
    assert one == two
    header, records, rows = one
    assert all(r.input_length + r.output_length <= 700 for r in records)
    assert {r.session_id for r in records} == {"s00", "s01", "cold0"}
    assert [row["kind"] for row in rows if row["session_id"] == "s00"] == ["read", "read", "edit"]
    write_trace(tmp_path / "t.jsonl", header, records)
    assert read_trace(tmp_path / "t.jsonl") == (header, sorted(records, key=lambda r: r.timestamp))


def test_a_plain_mooncake_trace_reads_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]}\n'
                    '{"timestamp": 5, "input_length": 700, "output_length": 12, "hash_ids": [0, 2]}\n')
    header, records = read_trace(path)
    assert header["block_tokens"] == 512 and [r.session_id for r in records] == ["req-1", "req-2"]
    path.write_text('{"timestamp": 0, "input_length": 600}\n')
    with pytest.raises(ValueError, match=r"mooncake.jsonl:1"):
        read_trace(path)
    with pytest.raises(ValueError, match="output_length 0"):
        TraceRecord(0, 10, 0, [0], "s", 1, "r")


def test_synthetic_ids_share_exactly_the_common_hash_prefix():
    a = TraceRecord(0, 40, 1, [0, 1, 2], "s", 1, "a")
    b = TraceRecord(0, 48, 1, [0, 1, 3], "s", 2, "b")
    ia, ib = synthetic_token_ids(a, 16, 1000), synthetic_token_ids(b, 16, 1000)
    assert len(ia) == 40 and len(ib) == 48 and ia[:32] == ib[:32] and ia[32:40] != ib[32:40]
    assert min(ia) >= 10 and max(ia) < 1000


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(KeyError, match="cpu"):
        load_profile("laptop")
