"""K13/K15: `run-batch` applies the server's per-request prompt-token limit (`max_prompt_tokens_per_request`,
prompt tokens x n) to every row, as `/v1/chat/completions` does: a row over it is that row's 400 in the
OpenAI shape naming the limit (param `messages`), the other rows run, and nothing over the limit reaches the
engine. Before, the batch path never checked it: the limit a server enforces was bypassed by sending the same
body through a batch file."""

from __future__ import annotations

import json

from shared_engine.entrypoints.batch.run_batch import run_batch
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.batch.conftest import chat_row, write_lines
from tests.batch.test_run_batch import assert_error_shape, read_out


def prompt_len(llm, row: dict) -> int:
    return len(llm.chat([row["body"]["messages"]], _one_token(), use_tqdm=False)[0].prompt_token_ids)


def _one_token():
    from shared_engine import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=1)


def test_rows_over_the_prompt_token_limit_are_400_and_the_others_run(batch_llm, tmp_path):
    short = chat_row("short", "Printer jammed.")
    long = chat_row("long", "My laptop will not charge since the update, I tried two cables and a new socket. " * 3)
    short_n2 = chat_row("short-n2", "Printer jammed.", n=2)
    n_short, n_long = prompt_len(batch_llm, short), prompt_len(batch_llm, long)
    assert n_long > n_short + 20
    limit = n_short + 5  # short fits once, not twice (n=2); long never fits
    assert 2 * n_short > limit
    write_lines(tmp_path / "in.jsonl", [short, long, short_n2])
    added = []
    engine = batch_llm.engine
    real_add = engine.add_request
    engine.add_request = lambda rid, ids, *a, **k: added.append(len(ids)) or real_add(rid, ids, *a, **k)
    try:
        summary = run_batch(batch_llm, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "ticket-summariser",
                            use_tqdm=False, server_config=ServerConfig(max_prompt_tokens_per_request=limit))
    finally:
        del engine.add_request
    out = {r["custom_id"]: r for r in read_out(tmp_path / "out.jsonl")}
    assert [r for r in out] == ["short", "long", "short-n2"]
    assert summary.num_succeeded == 1 and summary.num_failed == 2
    assert out["short"]["error"] is None and out["short"]["response"]["status_code"] == 200
    for cid, tokens, n in [("long", n_long, 1), ("short-n2", n_short, 2)]:
        row = out[cid]
        assert_error_shape(row, 400)
        err = row["response"]["body"]["error"]
        assert err["param"] == "messages", err
        assert f"{tokens} tokens" in err["message"] and f"{tokens * n}" in err["message"], err
        assert f"{limit} allowed per request" in err["message"], err
    assert n_long not in added  # the refused rows never reached the engine
    assert added.count(n_short) == 1


def test_the_cli_passes_the_limit_to_the_rows(tmp_path, default_model_dir):
    """`run-batch --max-prompt-tokens-per-request N`: the flag reaches the rows (the CLI shares `serve`'s
    flags; a flag the batch ignored would be a silent bypass)."""
    from shared_engine.__main__ import main

    write_lines(tmp_path / "in.jsonl", [chat_row("a", "Printer jammed.")])
    code = main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                 str(default_model_dir), "--max-model-len", "256", "--kv-cache-memory", str(16 * 2**20),
                 "--max-prompt-tokens-per-request", "8", "--disable-progress-bar"])
    assert code == 0
    (row,) = read_out(tmp_path / "out.jsonl")
    assert_error_shape(row, 400)
    assert "8 allowed per request" in row["response"]["body"]["error"]["message"], json.dumps(row)
