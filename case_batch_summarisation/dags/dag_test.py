"""Run the DAG once in-process with `dag.test()` (Airflow's own test runner: every task, mapped ones
included, against a throwaway SQLite metadata database) and print the report as JSON. Runs in the Airflow
virtual environment (`make airflow-venv`), never the engine's:

    BATCH_NIGHTS_DIR=/tmp/nights BATCH_ENGINE_PYTHON=.venv/bin/python \\
        .venv-airflow/bin/python case_batch_summarisation/dags/dag_test.py '{"num_tickets": 12, ...}' [RUNS]

RUNS (default 1) runs of the same conf one after another (with a `night` in the conf, the later runs find the
night's shards finished and skip them). Prints one JSON line per run. `BATCH_FAULT_KILL_SHARD=shard-00000`:
the fault test: SIGKILL that shard's engine process once, mid-shard (after its engine has started), so that
the task fails and Airflow's retry has to finish the shard. `DAG_TEST_OUT=FILE`: also write the runs, the
conf, the command, the commit and the machine to FILE (a results file); with `DAG_TEST_ONLINE_ANSWERS=FILE`
(loadtest/first_vs_fix.py `--answers-out`) also whether the first run's summaries equal the online path's.

Exit status 1 (and the failed tasks' states) if any task failed or the DAG file does not import cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

DAGS = Path(__file__).resolve().parent
sys.path.insert(0, str(DAGS.parents[1]))


def kill_once(night_dir: Path, shard: str, timeout_s: float = 600) -> threading.Thread:
    """Wait for `shard`'s engine (its pid file and the engine's KV-capacity line in its log: the shard's rows
    are being read and the model loaded, no output can exist yet), SIGKILL it once."""

    def watch():
        pid_file, log = night_dir / "out" / f".{shard}.worker.pid", night_dir / "logs" / f"{shard}.log"
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if pid_file.exists() and log.exists() and "KV cache size" in log.read_text(errors="replace"):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                print(json.dumps({"killed": shard, "pid": int(pid_file.read_text())}), flush=True)
                return
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def main() -> int:
    conf = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    home = Path(tempfile.mkdtemp(prefix="airflow_home_"))
    os.environ.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
                      AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__UNIT_TEST_MODE="False",
                      AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db")
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db

    db.resetdb()
    bag = DagBag(dag_folder=str(DAGS / "ticket_summaries.py"))
    if bag.import_errors:
        print(json.dumps({"import_errors": {k: str(v) for k, v in bag.import_errors.items()}}))
        return 1
    dag = bag.get_dag("ticket_summaries")
    ok, results, started = True, [], time.time()
    if os.environ.get("BATCH_FAULT_KILL_SHARD"):
        kill_once(Path(os.environ["BATCH_NIGHTS_DIR"]) / (conf.get("night") or "2026-12-01"),
                  os.environ["BATCH_FAULT_KILL_SHARD"])
    for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
        run = dag.test(logical_date=datetime(2026, 12, 1 + i, 22, tzinfo=UTC), run_conf=conf)
        tis = run.get_task_instances()
        states = {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in tis}
        tries = {f"{ti.task_id}[{ti.map_index}]": ti.try_number for ti in tis}
        night = Path(os.environ["BATCH_NIGHTS_DIR"]) / (conf.get("night") or f"2026-12-{1 + i:02d}")
        report = json.loads((night / "report.json").read_text()) if (night / "report.json").exists() else None
        results.append({"dag_run_state": str(run.state), "task_states": states, "try_numbers": tries,
                        "night_dir": str(night), "report": report})
        print(json.dumps(results[-1]), flush=True)
        ok = ok and str(run.state).endswith("success")
    if os.environ.get("DAG_TEST_OUT"):
        write_results(Path(os.environ["DAG_TEST_OUT"]), conf, results, time.time() - started)
    return 0 if ok else 1


def write_results(path: Path, conf: dict, runs: list[dict], wall_s: float) -> None:
    import platform

    from benchmarks.env_info import git_commit

    extra = {}
    if os.environ.get("DAG_TEST_ONLINE_ANSWERS") and runs:
        from case_batch_summarisation.loadtest.compose_night import answers_equal, offline_answers

        online = json.loads(Path(os.environ["DAG_TEST_ONLINE_ANSWERS"]).read_text())
        extra["answers_equal"] = answers_equal(online, offline_answers(Path(runs[0]["night_dir"]) / "out"))
        extra["online_answers"] = os.environ["DAG_TEST_ONLINE_ANSWERS"]
    path.write_text(json.dumps({**extra,
        "benchmark": "dag_test", "command": " ".join(sys.argv), "git_commit": git_commit(),
        "machine": {"cpu_cores": os.cpu_count(), "load_average_1_5_15": list(os.getloadavg()),
                    "python": platform.python_version()},
        "engine_config": os.environ.get("BATCH_ENGINE_CONFIG", "case_batch_summarisation/the_fix/config_cpu.yaml"),
        "fault": os.environ.get("BATCH_FAULT_KILL_SHARD"), "conf": conf, "wall_s": wall_s, "runs": runs},
        indent=2))


if __name__ == "__main__":
    sys.exit(main())
