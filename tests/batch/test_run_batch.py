"""K13 (batch files) against `run-batch` on the default model: a bad row never fails or shifts the others,
error rows keep OpenAI's shape, duplicate custom_ids are refused up front, the output appears atomically,
and the shared instruction is prefilled once and hit from the prefix cache."""

from __future__ import annotations

import json

import pytest

from shared_engine import SamplingParams
from shared_engine.entrypoints.batch.batch_input import DuplicateCustomIdError
from shared_engine.entrypoints.batch.batch_output import write_jsonl_atomic
from shared_engine.entrypoints.batch.run_batch import run_batch
from tests.batch.conftest import SYSTEM, chat_row, write_lines

GOOD = [("t1", "My Acme Router drops the connection every few minutes since Monday."),
        ("t2", "I was charged twice for the pro plan this month, please refund one."),
        ("t3", "Thanks, the thermostat works again after the reset!")]
BAD = [
    ("not json at all", None, 400),
    ('{"method": "POST", "url": "/v1/chat/completions", "body": {}}', None, 400),  # no custom_id
    (chat_row("bad-url", "x") | {"url": "/v1/embeddings"}, "bad-url", 400),
    (chat_row("bad-method", "x") | {"method": "GET"}, "bad-method", 400),
    ({"custom_id": "no-messages", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}},
     "no-messages", 400),
    (chat_row("hot", "x", temperature="hot"), "hot", 400),
    (chat_row("too-long", "word " * 700), "too-long", 400),  # over max_model_len 512
    (chat_row("other-model", "x", model="no-such-model"), "other-model", 404),
    (chat_row("stream", "x", stream=True), "stream", 400),
    ('[1, 2, 3]', None, 400),
]


def read_out(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_error_shape(row: dict, status: int) -> None:
    assert set(row) == {"id", "custom_id", "response", "error"}
    assert row["id"].startswith("batch_req_")
    resp = row["response"]
    assert resp["status_code"] == status and resp["request_id"]
    err = resp["body"]["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    assert row["error"] == {"code": err["type"], "message": err["message"]}


def test_bad_rows_never_fail_or_shift_the_others(batch_llm, tmp_path):
    """Good rows interleaved with every kind of bad row: one output row per input line, in input order,
    and each good row's answer is exactly what the offline chat API gives for it alone (greedy)."""
    lines = []
    for i, (cid, text) in enumerate(GOOD):
        lines.append(chat_row(cid, text))
        lines.extend(b[0] for b in BAD[i::3])
    write_lines(tmp_path / "in.jsonl", lines + ["", "   "])  # blank lines are skipped, not rows
    summary = run_batch(batch_llm, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "ticket-summariser",
                        use_tqdm=False)
    out = read_out(tmp_path / "out.jsonl")
    assert len(out) == len(lines) == summary.num_rows
    assert summary.num_failed == len(BAD) and summary.num_succeeded == len(GOOD)
    expected = {b[0] if isinstance(b[0], str) else json.dumps(b[0]): b for b in BAD}
    for line, row in zip(lines, out):
        key = line if isinstance(line, str) else json.dumps(line)
        if key in expected:
            _, cid, status = expected[key]
            assert row["custom_id"] == cid
            assert_error_shape(row, status)
        else:
            assert row["custom_id"] == line["custom_id"] and row["error"] is None
            assert row["response"]["status_code"] == 200
    reference = batch_llm.chat([[{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}]
                                for _, t in GOOD], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    got = {r["custom_id"]: r["response"]["body"] for r in out if r["error"] is None}
    for (cid, _), ref in zip(GOOD, reference):
        body = got[cid]
        assert body["object"] == "chat.completion" and body["model"] == "ticket-summariser"
        assert body["choices"][0]["message"]["content"] == ref.outputs[0].text
        assert body["usage"]["completion_tokens"] == len(ref.outputs[0].token_ids)
        assert body["usage"]["prompt_tokens"] == len(ref.prompt_token_ids)
    too_long = next(r for r in out if r["custom_id"] == "too-long")
    assert "512" in too_long["response"]["body"]["error"]["message"]  # names the model's limit


def test_shared_instruction_prefilled_once_and_hit(batch_llm, tmp_path):
    rows = [chat_row(f"p{i}", f"Ticket number {i}: my camera {'stopped' if i % 2 else 'froze'} again.")
            for i in range(6)]
    write_lines(tmp_path / "in.jsonl", rows)
    batch_llm.engine.block_manager.reset_prefix_cache()  # nothing cached from the earlier tests
    summary = run_batch(batch_llm, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "ticket-summariser",
                        use_tqdm=False)
    block = batch_llm.engine.config.cache.block_size
    assert summary.shared_prefix_tokens >= block and summary.shared_prefix_tokens % block == 0
    for row in read_out(tmp_path / "out.jsonl"):
        cached = row["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= summary.shared_prefix_tokens  # every row, the first ones included, hit the prefix
    assert summary.cached_prompt_tokens >= len(rows) * summary.shared_prefix_tokens
    assert summary.prefix_cache_hit_rate > 0


def test_duplicate_custom_ids_refused_before_anything_runs(batch_llm, tmp_path):
    write_lines(tmp_path / "in.jsonl", [chat_row("a", "x"), chat_row("b", "y"), chat_row("a", "z")])
    steps = batch_llm.engine.stats.num_steps
    with pytest.raises(DuplicateCustomIdError, match=r"'a' \(lines 1, 3\)"):
        run_batch(batch_llm, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "m", use_tqdm=False)
    assert batch_llm.engine.stats.num_steps == steps and not (tmp_path / "out.jsonl").exists()


def test_cli_refuses_duplicates_with_exit_2_and_no_output(tmp_path, caplog):
    from shared_engine.__main__ import main

    write_lines(tmp_path / "in.jsonl", [chat_row("a", "x"), chat_row("a", "y")])
    assert main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]) == 2
    assert not (tmp_path / "out.jsonl").exists()
    assert "duplicate custom_id" in caplog.text


def test_output_written_atomically(tmp_path):
    """A writer that dies mid-file leaves the previous file untouched and no temp file behind."""
    target = tmp_path / "out.jsonl"
    write_jsonl_atomic(target, [{"custom_id": "old"}])

    def rows():
        yield {"custom_id": "new-1"}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_jsonl_atomic(target, rows())
    assert read_out(target) == [{"custom_id": "old"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
