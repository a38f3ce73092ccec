"""tail_report.py: nearest-rank percentiles and the skip of a phase's first seconds, on a made-up samples file."""

import json

import pytest

from case_multilora.loadtest.tail_report import tail


def test_no_timed_request_is_an_error(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({"kind": "whale", "tenant": "w", "t_s": 12.0, "status": 200, "ttft_s": 9.0}))
    with pytest.raises(ValueError, match="no well-behaved"):
        tail(path, skip_s=10.0)


def test_tail_leaves_out_the_first_seconds_and_whales(tmp_path):
    rows = [{"kind": "well-behaved", "tenant": "t1", "t_s": 1.0, "status": 200, "ttft_s": 0.5}] * 2  # a cold stall
    rows += [{"kind": "well-behaved", "tenant": "t2", "t_s": 11.0 + i, "status": 200, "ttft_s": 0.02}
             for i in range(98)]
    rows += [{"kind": "whale", "tenant": "w", "t_s": 12.0, "status": 200, "ttft_s": 9.0},
             {"kind": "well-behaved", "tenant": "t3", "t_s": 13.0, "status": "incomplete", "ttft_s": None}]
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    out = tail(path, skip_s=10.0, top=2)
    assert out["num"] == 100 and out["num_after_skip"] == 98
    assert out["p99_ms"] == 500.0 and out["p99_after_skip_ms"] == 20.0
    assert out["slowest"][0] == {"t_s": 1.0, "tenant": "t1", "ttft_ms": 500.0}
