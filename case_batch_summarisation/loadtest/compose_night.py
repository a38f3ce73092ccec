"""A night through the compose stack's Airflow (docker-compose.yaml), over its REST API: log in (the simple auth
manager's `POST /auth/token`), trigger `ticket_summaries` with a conf (`POST /api/v2/dags/.../dagRuns`), wait
for the run, read its report from the nights folder (NIGHTS_VOLUME bound to a host path), and optionally
check the fix's answers against the online path's (first_vs_fix.py `--answers-out`).

    NIGHTS_VOLUME=/tmp/nights BATCH_DAG_SCHEDULE=none scripts/compose.sh up batch_summarisation
    python case_batch_summarisation/loadtest/compose_night.py --api http://127.0.0.1:8080 --nights /tmp/nights \\
        --conf '{"night": "cpu-200", "num_tickets": 200, ...}' \\
        --online-answers first_attempt/answers_compose_cpu.json --out the_fix/results_compose_cpu.json

`airflow_client` and `run_night` are also the compose test's (tests/deploy/test_compose_batch.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DAG_ID = "ticket_summaries"


def airflow_client(api: str, username: str = "admin", password: str = "admin", timeout_s: float = 120):
    """An httpx client on `api`/api/v2 with a bearer token from the simple auth manager's login. Raises
    `RuntimeError` when the login is refused."""
    import httpx

    token = httpx.post(f"{api}/auth/token", json={"username": username, "password": password}, timeout=timeout_s)
    if token.status_code != 201:
        raise RuntimeError(f"login refused ({token.status_code}): {token.text[:500]}")
    return httpx.Client(base_url=f"{api}/api/v2", timeout=timeout_s,
                        headers={"Authorization": f"Bearer {token.json()['access_token']}"})


def run_night(client, conf: dict, timeout_s: float = 3600, parse_timeout_s: float = 180) -> tuple[dict, dict]:
    """Trigger the DAG with `conf` (no logical date: a manual run) once the dag-processor has parsed it, wait
    until the run succeeds or fails; returns (the dag run's JSON, {"task[map_index]": state}). Raises
    `TimeoutError` when the DAG never appears or the run does not finish within `timeout_s` seconds."""
    deadline = time.monotonic() + parse_timeout_s
    while (dag := client.get(f"/dags/{DAG_ID}")).status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"DAG {DAG_ID} not parsed after {parse_timeout_s} s: {dag.text[:300]}")
        time.sleep(3)
    if dag.json()["is_paused"]:
        client.patch(f"/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
    trigger = client.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
    trigger.raise_for_status()
    run_id = trigger.json()["dag_run_id"]
    deadline = time.monotonic() + timeout_s
    while (run := client.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json())["state"] not in ("success", "failed"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run['state']} after {timeout_s} s")
        time.sleep(5)
    tis = client.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    return run, {f"{t['task_id']}[{t['map_index']}]": t["state"] for t in tis}


def offline_answers(out_dir: Path) -> dict[str, str]:
    """{custom_id: summary text} of a night's shard outputs (successful rows only)."""
    answers = {}
    for path in sorted(out_dir.glob("shard-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["error"] is None:
                answers[row["custom_id"]] = row["response"]["body"]["choices"][0]["message"]["content"]
    return answers


def answers_equal(online: dict[str, str], offline: dict[str, str]) -> dict:
    same = [cid for cid in online if offline.get(cid) == online[cid]]
    return {"tickets": len(online), "equal": len(same), "different": sorted(set(online) - set(same))}


def _seconds(run: dict) -> float:
    start, end = (datetime.fromisoformat(run[k].replace("Z", "+00:00")) for k in ("start_date", "end_date"))
    return (end - start).total_seconds()


def main() -> None:
    from benchmarks.env_info import environment

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", default="http://127.0.0.1:8080")
    p.add_argument("--nights", type=Path, required=True, help="the host folder bound as NIGHTS_VOLUME")
    p.add_argument("--conf", type=json.loads, required=True, help="the DAG run's conf (JSON); needs a night")
    p.add_argument("--online-answers", type=Path, help="first_vs_fix.py --answers-out: compare with these")
    p.add_argument("--out", type=Path, help="results file")
    args = p.parse_args()
    client = airflow_client(args.api)
    load_at_start = list(os.getloadavg())
    started = time.time()
    run, states = run_night(client, args.conf)
    night = args.nights / args.conf["night"]
    report = json.loads((night / "report.json").read_text()) if (night / "report.json").exists() else None
    result = {"variant": "the_fix_compose", **environment(), "command": " ".join(sys.argv), "conf": args.conf,
              "stack": "case_batch_summarisation/docker-compose.yaml (Airflow LocalExecutor, Postgres)",
              "dag_run_state": run["state"], "task_states": states, "dag_run_s": _seconds(run),
              "trigger_to_done_s": time.time() - started, "load_average_1_5_15_at_start": load_at_start,
              "report": report}
    if report:
        result["tickets_per_dag_run_s"] = report["num_rows"] / result["dag_run_s"]
        result["tickets_per_engine_s"] = report["rows_per_engine_s"]
    if args.online_answers:
        result["answers_equal"] = answers_equal(json.loads(args.online_answers.read_text()),
                                                offline_answers(night / "out"))
    print(json.dumps({k: v for k, v in result.items() if k not in ("report", "engine_config")}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    sys.exit(0 if run["state"] == "success" else 1)


if __name__ == "__main__":
    main()
