"""The overnight DAG end to end with `dag.test()`, in Airflow's own virtual environment (`make airflow-venv`):
tonight's tickets generated, split into shards, a mapped engine task per shard, validation, the report;
with the fault: shard 0's engine process is SIGKILLed mid-shard, its task fails and Airflow's retry
finishes it; then the same night again, which skips every finished shard. Every custom_id exactly once.
Fails (never skips) when the Airflow venv cannot be set up."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from case_batch_summarisation.batch import shards

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_PY = ROOT / ".venv-airflow" / "bin" / "python"


@pytest.fixture(scope="session")
def airflow_python() -> Path:
    if not (ROOT / ".venv-airflow" / ".installed").exists():
        r = subprocess.run(["make", "airflow-venv"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            pytest.fail(f"make airflow-venv failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    check = subprocess.run([str(AIRFLOW_PY), "-c", "import airflow.sdk"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.fail(f"the Airflow venv does not import airflow.sdk:\n{check.stderr[-2000:]}")
    return AIRFLOW_PY


def test_dag_night_end_to_end_then_rerun_skips(airflow_python, tmp_path):
    conf = {"night": "n1", "num_tickets": 7, "median_tokens": 30.0, "max_ticket_tokens": 120,
            "max_completion_tokens": 160, "rows_per_shard": 3}  # the fix's rows: schema-constrained summaries
    env = {**os.environ, "BATCH_NIGHTS_DIR": str(tmp_path), "BATCH_ENGINE_PYTHON": str(ROOT / ".venv" / "bin" /
                                                                                          "python"),
           "BATCH_RETRY_DELAY_S": "1", "PYTHONPATH": "", "BATCH_FAULT_KILL_SHARD": "shard-00000"}
    r = subprocess.run([str(airflow_python), str(ROOT / "case_batch_summarisation" / "dags" / "dag_test.py"),
                        json.dumps(conf), "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    killed = [x for x in lines if "killed" in x]
    runs = [x for x in lines if "dag_run_state" in x]
    assert r.returncode == 0 and len(runs) == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert killed == [{"killed": "shard-00000", "pid": killed[0]["pid"]}]
    first, second = runs
    assert set(first["task_states"]) == {"prepare_night[-1]", "split_night[-1]", "summarise_shard[0]",
                                         "summarise_shard[1]", "summarise_shard[2]", "validate_night[-1]",
                                         "report_night[-1]"}
    assert all(s.endswith("success") for run in runs for s in run["task_states"].values())
    assert first["try_numbers"]["summarise_shard[0]"] == 2  # the killed try failed, the retry finished it
    assert first["try_numbers"]["summarise_shard[1]"] == 1
    report = first["report"]
    assert report["num_shards"] == 3 and report["num_shards_skipped"] == 0
    assert report["num_rows"] == report["num_succeeded"] == 7 and report["num_failed"] == 0
    assert report["summaries_valid"] == 7 and report["summaries_invalid"] == 0, report  # every row the JSON shape
    assert report["completion_tokens"] > 0 and report["gpu_hours"] > 0 and report["cost_usd"] > 0
    assert second["report"]["num_shards_skipped"] == 3  # the rerun delivered nothing twice
    night = tmp_path / "n1"
    manifest = json.loads((night / "shards" / shards.MANIFEST).read_text())
    counts = shards.check_exactly_once(manifest, night / "shards", night / "out")
    assert counts["num_custom_ids"] == 7
    assert json.loads((night / "validation.json").read_text())["rows"] == 7
    visible = sorted(p.name for p in (night / "out").iterdir() if not p.name.startswith("."))
    assert visible == [f"shard-0000{i}.{kind}" for i in range(3) for kind in ("done.json", "jsonl")]
