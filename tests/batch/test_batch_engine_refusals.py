"""K13: rows that pass the body's validation but that the engine refuses when they are checked or queued (a
`response_format` schema it cannot compile, a `logit_bias` id outside the vocabulary, `max_completion_tokens`
past the context) are each their own 400 row in the OpenAI shape; they never fail the batch or shift
the rows around them, and the good rows still equal the offline chat API's answers."""

from __future__ import annotations

from shared_engine import SamplingParams
from shared_engine.entrypoints.batch.run_batch import run_batch
from tests.batch.conftest import SYSTEM, chat_row, write_lines
from tests.batch.test_run_batch import assert_error_shape, read_out

BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "no-such-type"}}}


def test_engine_refusals_are_their_own_rows(batch_llm, tmp_path):
    good = [("g1", "The scanner shows error E4."), ("g2", "Please cancel my order 1182."),
            ("g3", "Headphones arrived broken.")]
    bad = [chat_row("schema", "x", response_format=BAD_SCHEMA),
           chat_row("bias", "x", logit_bias={"999999999": 5}),
           chat_row("long-out", "x", max_completion_tokens=100_000)]
    lines = [chat_row(*good[0]), bad[0], chat_row(*good[1]), bad[1], bad[2], chat_row(*good[2])]
    write_lines(tmp_path / "in.jsonl", lines)
    summary = run_batch(batch_llm, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "ticket-summariser",
                        use_tqdm=False)
    out = read_out(tmp_path / "out.jsonl")
    assert [r["custom_id"] for r in out] == [line["custom_id"] for line in lines]
    assert summary.num_failed == 3 and summary.num_succeeded == 3
    for row in out:
        if row["custom_id"] in {"schema", "bias", "long-out"}:
            assert_error_shape(row, 400)
        else:
            assert row["error"] is None and row["response"]["status_code"] == 200
    reference = batch_llm.chat([[{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}]
                                for _, t in good], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    got = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in out
           if r["error"] is None}
    assert [got[cid] for cid, _ in good] == [ref.outputs[0].text for ref in reference]
    assert not batch_llm.engine.has_unfinished_requests()
    batch_llm.engine.block_manager.check_integrity()
