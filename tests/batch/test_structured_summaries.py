"""The fix's rows (the generator's: the summary's JSON schema as `response_format`, SUMMARY_MAX_TOKENS)
through `run_batch` on the default model: every summary validates against the fixed JSON shape, ends by
itself (finish_reason stop, not max_tokens) and stays inside the schema's per-value lengths. Unconstrained,
the same rows do not (the reason the schema is sent)."""

from __future__ import annotations

import json

import pytest

from case_batch_summarisation.batch.summary_schema import (
    SUMMARY_MAX_TOKENS,
    max_summary_chars,
    summary_problem,
    validate_output_rows,
)
from case_batch_summarisation.tickets.generator import TicketSpec, generate, write
from shared_engine.entrypoints.batch.run_batch import run_batch

SPEC = TicketSpec(median_tokens=30.0, max_tokens=120)


@pytest.fixture(scope="module")
def llm(default_model_dir):
    from shared_engine import LLM

    return LLM(str(default_model_dir), max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=2048,
               kv_cache_memory=128 * 2**20)


def run(llm, tmp_path, structured: bool):
    src, out = tmp_path / f"in_{structured}.jsonl", tmp_path / f"out_{structured}.jsonl"
    write(src, generate(3, 0, SPEC, structured=structured))
    assert all(json.loads(r)["body"]["max_completion_tokens"] == SUMMARY_MAX_TOKENS
               for r in src.read_text().splitlines())
    run_batch(llm, src, out, "ticket-summariser", use_tqdm=False)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_constrained_summaries_validate_and_end_by_themselves(llm, tmp_path):
    rows = run(llm, tmp_path, structured=True)
    counts = validate_output_rows([json.dumps(r) for r in rows])
    assert counts["summaries_valid"] == counts["rows"] == 3, counts
    for r in rows:
        body = r["response"]["body"]
        assert body["choices"][0]["finish_reason"] == "stop", body
        assert body["usage"]["completion_tokens"] < SUMMARY_MAX_TOKENS


def test_the_cap_lets_the_longest_object_close():
    """A token of ASCII text is at least one character: the cap covers the schema's longest object."""
    assert 400 < max_summary_chars() <= SUMMARY_MAX_TOKENS


def test_unconstrained_rows_are_why_the_schema_is_sent(llm, tmp_path):
    rows = run(llm, tmp_path, structured=False)
    problems = [summary_problem(r["response"]["body"]["choices"][0]["message"]["content"]) for r in rows]
    assert any(p is not None for p in problems), problems
