"""The overnight DAG (Airflow 3, `airflow.sdk` TaskFlow): tonight's tickets → shards → one mapped engine task
per shard → validation → report.

    prepare_night → split_night → summarise_shard.expand(...) → validate_night → report_night

- `prepare_night`: picks up `$BATCH_NIGHTS_DIR/incoming/<night>.jsonl` if the night's export is there, else
  generates `num_tickets` seeded tickets (tickets/generator.py); the night is the run's logical date, or the
  `night` param.
- `split_night`: shards of `rows_per_shard` rows with a manifest (batch/shards.py); a rerun keeps them.
- `summarise_shard` (mapped, `.expand`): `run-batch` on one shard in the engine's own environment
  (batch/worker.py), in the `gpu` pool (its size = the GPUs: one shard per GPU at a time), retried with
  exponential backoff; a finished shard is skipped, so a retry never duplicates rows.
- `validate_night`: every input custom_id exactly once across the outputs (else the task fails), and every
  summary against the JSON shape (batch/summary_schema.py; invalid ones are counted, not fatal).
- `report_night`: counts, tokens/s, GPU-hours and cost (batch/night_report.py) into `report.json`.

Environment: `BATCH_NIGHTS_DIR` (shared volume), `BATCH_ENGINE_PYTHON` (the engine's python), `BATCH_ENGINE_CONFIG`
(default the_fix/config_cpu.yaml), `BATCH_NUM_GPUS` (0 on a CPU host), `BATCH_GPU_POOL` (default `gpu`),
`BATCH_SHARD_RETRIES` (3), `BATCH_RETRY_DELAY_S` (30), `BATCH_DAG_SCHEDULE` (cron, default `0 22 * * *`;
`none`: manual runs only).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, task

CASE_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CASE_DIR.parent))

from case_batch_summarisation.batch import shards  # noqa: E402

POOL = os.environ.get("BATCH_GPU_POOL", "gpu")
RETRIES = int(os.environ.get("BATCH_SHARD_RETRIES", "3"))
RETRY_DELAY_S = float(os.environ.get("BATCH_RETRY_DELAY_S", "30"))
# Nightly at 22:00 (the 8-hour window ends at 06:00); `none`: manual runs only (the compose test's stack).
SCHEDULE = os.environ.get("BATCH_DAG_SCHEDULE", "0 22 * * *")


def nights_dir() -> Path:
    return Path(os.environ.get("BATCH_NIGHTS_DIR", "/data/nights"))


def engine_config() -> Path:
    return Path(os.environ.get("BATCH_ENGINE_CONFIG", CASE_DIR / "the_fix" / "config_cpu.yaml"))


@dag(
    dag_id="ticket_summaries",
    schedule=None if SCHEDULE.strip().lower() in ("", "none") else SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["case_batch_summarisation"],
    # every task survives a transient failure (an execution-API timeout on a loaded host); the shard task
    # has its own, longer, backoff
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    params={
        "night": Param(None, type=["null", "string"], description="night id (default: the logical date)"),
        "num_tickets": Param(300, type="integer", minimum=1, description="generated when no export is found"),
        "seed": Param(0, type="integer"),
        "median_tokens": Param(600.0, type="number"),
        "max_ticket_tokens": Param(6000, type="integer"),
        "max_completion_tokens": Param(512, type="integer", minimum=1),  # summary_schema.SUMMARY_MAX_TOKENS
        "rows_per_shard": Param(100, type="integer", minimum=1),
        "gpu_hour_usd": Param(None, type=["null", "number"], description="default: the H200 profile's price"),
    },
)
def ticket_summaries():
    @task
    def prepare_night(**context) -> str:
        from case_batch_summarisation.tickets.generator import TicketSpec, generate, write

        p = context["params"]
        # a manual run through the REST API may have no logical date: then the day it was asked to run
        night = p["night"] or context.get("ds") or context["dag_run"].run_after.strftime("%Y-%m-%d")
        night_dir = nights_dir() / night
        source = nights_dir() / "incoming" / f"{night}.jsonl"
        target = night_dir / "input.jsonl"
        if source.exists():
            shards.write_atomic(target, source.read_bytes())
        elif not target.exists():
            spec = TicketSpec(median_tokens=p["median_tokens"], max_tokens=p["max_ticket_tokens"])
            write(target, generate(p["num_tickets"], p["seed"], spec,
                                   max_completion_tokens=p["max_completion_tokens"]))
        return str(night_dir)

    @task
    def split_night(night_dir: str, **context) -> list[dict]:
        m = shards.split(Path(night_dir) / "input.jsonl", Path(night_dir) / "shards",
                         context["params"]["rows_per_shard"])
        return [{"night_dir": night_dir, "name": s["name"]} for s in m["shards"]]

    @task(pool=POOL, retries=RETRIES, retry_delay=timedelta(seconds=RETRY_DELAY_S),
          retry_exponential_backoff=2.0, max_retry_delay=timedelta(minutes=30))  # 30 s, 60 s, 120 s
    def summarise_shard(shard: dict) -> dict:
        from case_batch_summarisation.batch.worker import run_shard

        return run_shard(Path(shard["night_dir"]), shard["name"], engine_config())

    @task
    def validate_night(night_dir: str, records: list[dict]) -> dict:
        from case_batch_summarisation.batch.summary_schema import validate_output_rows

        night = Path(night_dir)
        manifest = json.loads((night / "shards" / shards.MANIFEST).read_text())
        counts = shards.check_exactly_once(manifest, night / "shards", night / "out")
        total = {"rows": 0, "error_rows": 0, "summaries_valid": 0, "summaries_invalid": 0, "problems": {}}
        for s in manifest["shards"]:
            v = validate_output_rows((night / "out" / f"{s['name']}.jsonl").read_text().splitlines())
            for k in ("rows", "error_rows", "summaries_valid", "summaries_invalid"):
                total[k] += v[k]
            for k, n in v["problems"].items():
                total["problems"][k] = total["problems"].get(k, 0) + n
        result = {**counts, **total}
        shards.write_atomic(night / "validation.json", json.dumps(result, indent=2))
        return result

    @task
    def report_night(night_dir: str, records: list[dict], validation: dict, **context) -> dict:
        from case_batch_summarisation.batch.night_report import night_report

        report = night_report(list(records), validation, context["params"]["gpu_hour_usd"])
        shards.write_atomic(Path(night_dir) / "report.json", json.dumps(report, indent=2))
        return report

    night_dir = prepare_night()
    records = summarise_shard.expand(shard=split_night(night_dir))
    validation = validate_night(night_dir, records)
    report_night(night_dir, records, validation)


dag_object = ticket_summaries()
