"""h200_row.py: the README table and the calibration step from an H200 results file; a partial run refused."""

from __future__ import annotations

import json
from pathlib import Path

from case_batch_summarisation.loadtest import h200_row

MEASURED = Path(__file__).resolve().parents[2] / "case_batch_summarisation" / "the_fix" / "offline_h200.json"


def test_table_carries_the_files_figures():
    d = json.loads(MEASURED.read_text())
    text = h200_row.table(d)
    r = d["run"]
    assert f"| **tickets/s** | **{r['rows_per_s']:.1f}** |" in text
    assert f"{r['prefill_tokens_per_s']:,.0f}" in text
    assert f"**{100 * d['roofline']['fraction_of_roofline']:.1f}%**" in text
    assert f"{100 * r['prefix_cache_hit_rate']:.1f}%" in text
    assert d["commit"][:8] in text


def test_partial_run_is_refused(tmp_path, capsys):
    d = json.loads(MEASURED.read_text())
    d["workload"]["num_tickets"] = 20_000
    d["partial_run"] = {"stopped_by": "SIGTERM", "num_rows_finished": 11_000, "elapsed_s": 300.0,
                        "rows_per_s": 36.7, "prefill_tokens_per_s": 29_000.0}
    f = tmp_path / "partial.json"
    f.write_text(json.dumps(d))
    assert h200_row.main([str(f), "--calibrate"]) == 1
    assert "11,000 of 20,000" in capsys.readouterr().out  # what it reached, and nothing recalibrated


def test_workers_together():
    a = json.loads(MEASURED.read_text())
    b = json.loads(json.dumps(a))
    b["run"]["elapsed_s"] = 2 * a["run"]["elapsed_s"]
    b["run"]["rows_per_s"] = a["run"]["rows_per_s"] / 2
    line = h200_row.together([a, b])
    n = 2 * a["run"]["num_rows"]
    assert f"{n:,} tickets in {b['run']['elapsed_s']:.1f} s" in line
    assert f"= {n / b['run']['elapsed_s']:.1f} tickets/s" in line  # the slowest worker sets the wall time
