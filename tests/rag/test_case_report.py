"""`case_rag_chatbot/report.py` fills the README's generated blocks and draws the plots from the results files,
for the CPU pair, an H200 pair and a sweep alike (the H200 files here are copies of a CPU file, renamed)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

CASE = Path(__file__).resolve().parents[2] / "case_rag_chatbot"
sys.path.insert(0, str(CASE))

import report  # noqa: E402
from plots.make_plots import make_all  # noqa: E402


@pytest.fixture
def case_dir(tmp_path, monkeypatch):
    results = {v: CASE / v / "results_cpu.json" for v in report.VARIANTS}
    if not all(p.exists() for p in results.values()):
        pytest.skip("no CPU results files committed yet")
    for variant, path in results.items():
        (tmp_path / variant).mkdir()
        for profile in ("cpu", "h200"):
            shutil.copy(path, tmp_path / variant / f"results_{profile}.json")
    run = json.loads(results["the_fix"].read_text())
    sweep = {**run, "sweep_users": [8, 16], "runs": [run, run],
             "highest_sustained": {"users": 16, "request_throughput": 1.0}}
    (tmp_path / "the_fix" / "sweep_h200.json").write_text(json.dumps(sweep))
    (tmp_path / "plots").mkdir()
    shutil.copy(CASE / "README.md", tmp_path / "README.md")
    monkeypatch.setattr(report, "CASE_DIR", tmp_path)
    return tmp_path


def test_report_fills_every_block_for_both_profiles(case_dir):
    done = report.update_readme(case_dir / "README.md")
    assert {"README.md:numbers", "README.md:broke", "README.md:budget", "README.md:tenx"} <= set(done)
    text = (case_dir / "README.md").read_text()
    numbers = text.split("<!-- numbers:start")[1].split("<!-- numbers:end")[0]
    assert numbers.count("| **TTFT p95** |") == 2 and "Not measured yet" not in numbers
    assert "User sweep of the fix" in numbers and "Highest load sustained within the targets: 16 users" in numbers
    for row in ("**System-prompt hit rate**", "`vllm:num_requests_waiting` mean / max", "commit `"):
        assert row in numbers


def test_plots_for_both_profiles(case_dir):
    pytest.importorskip("matplotlib")
    written = make_all(case_dir)
    assert {p.name for p in written} == {"latency_cpu.png", "engine_cpu.png", "latency_h200.png", "engine_h200.png"}
    assert all(p.stat().st_size > 10_000 for p in written)
