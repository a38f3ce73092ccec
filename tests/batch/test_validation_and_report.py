"""The summary's JSON shape, the night report's arithmetic, and one GPU per shard worker."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest

from case_batch_summarisation.batch.gpu_slots import gpu_slot
from case_batch_summarisation.batch.night_report import night_report
from case_batch_summarisation.batch.summary_schema import SUMMARY_SCHEMA, summary_problem, validate_output_rows

GOOD = {"issue": "The router drops the connection.", "product": "Acme Router X2", "sentiment": "negative",
        "next_action": "Escalate to the network team."}


@pytest.mark.parametrize("text, problem", [
    (json.dumps(GOOD), None),
    (" " + json.dumps(GOOD) + "\n", None),
    ("", "empty"),
    ("The customer is unhappy.", "not JSON"),
    ("[1]", "not an object"),
    (json.dumps({**GOOD, "extra": "x"}), "keys"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "product"}), "keys"),
    (json.dumps({**GOOD, "sentiment": "angry"}), "sentiment"),
    (json.dumps({**GOOD, "issue": ""}), "non-empty"),
    (json.dumps({**GOOD, "issue": "x" * 200}), None),
    (json.dumps({**GOOD, "issue": "x" * 201}), "issue longer than 200"),
    (json.dumps({**GOOD, "next_action": "x" * 161}), "next_action longer than 160"),
])
def test_summary_problem_agrees_with_the_json_schema(text, problem):
    got = summary_problem(text)
    assert (got is None) == (problem is None) and (problem is None or problem in got)
    if text.strip().startswith("{"):
        valid = jsonschema.Draft202012Validator(SUMMARY_SCHEMA).is_valid(json.loads(text))
        assert valid == (got is None)


def _row(cid, content=None, status=200):
    if status != 200:
        return json.dumps({"custom_id": cid, "response": {"status_code": status, "body": {}}, "error": {"code": "x"}})
    return json.dumps({"custom_id": cid, "error": None, "response": {"status_code": 200, "body": {
        "choices": [{"message": {"content": content}}]}}})


def test_validate_output_rows_counts():
    counts = validate_output_rows([_row("a", json.dumps(GOOD)), _row("b", "nope"), _row("c", status=400)])
    assert counts == {"rows": 3, "error_rows": 1, "summaries_valid": 1, "summaries_invalid": 1,
                      "problems": {"not JSON": 1}}


def test_night_report_arithmetic():
    summary = {"num_rows": 10, "num_succeeded": 9, "num_failed": 1, "prompt_tokens": 9000, "prefill_tokens": 6000,
               "cached_prompt_tokens": 3000, "completion_tokens": 1000, "elapsed_s": 50.0}
    records = [{"summary": summary, "wall_s": 1800.0, "gpu": 0, "host": "h"},
               {"summary": summary, "wall_s": 1800.0, "gpu": 1, "host": "h", "skipped": True}]
    r = night_report(records, {"summaries_valid": 15, "summaries_invalid": 3}, gpu_hour_usd=2.0)
    assert r["num_rows"] == 20 and r["completion_tokens"] == 2000 and r["num_shards_skipped"] == 1
    assert r["gpu_hours"] == pytest.approx(1.0) and r["cost_usd"] == pytest.approx(2.0)
    assert r["output_tokens_per_engine_s"] == pytest.approx(20.0)
    assert r["usd_per_million_tokens"] == pytest.approx(2.0 / 0.02)
    assert r["workers"] == ["h:gpu0", "h:gpu1"]


def test_gpu_slots_give_each_worker_its_own_gpu(tmp_path):
    held, release, got = threading.Event(), threading.Event(), []

    def first():
        with gpu_slot(tmp_path, 2) as gpu:
            got.append(gpu)
            held.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    held.wait(10)
    with gpu_slot(tmp_path, 2) as gpu:
        got.append(gpu)
    release.set()
    t.join()
    assert sorted(got) == [0, 1]
    with gpu_slot(tmp_path, 0) as gpu:
        assert gpu is None
