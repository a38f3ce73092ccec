"""The batch case under Docker compose, end to end: case_batch_summarisation/docker-compose.yaml (Postgres,
Airflow 3's api-server, scheduler with the LocalExecutor and dag-processor, the default model converted into
a fresh volume by the engine image) started from the session's images (conftest.py), on free loopback ports,
with the nights volume bound to a temporary folder. A night of 24 short tickets is triggered through
Airflow's REST API (a token from the simple auth manager's login, then `POST /api/v2/dags/.../dagRuns`): the
DAG generates it, splits it into two shards, runs one mapped `summarise_shard` task per shard (the engine's
`run-batch` in the scheduler container), validates and reports. Every custom_id comes back exactly once, in
valid OpenAI batch output rows; a second run of the same night skips both shards and changes no output.
Torn down, volumes included, also when a step fails. Skips without Docker unless
SHARED_ENGINE_REQUIRE_DOCKER=1, then fails.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from case_batch_summarisation.batch import shards
from case_batch_summarisation.loadtest.compose_night import airflow_client, run_night
from tests.deploy.docker_helpers import REPO, compose_stack, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

COMPOSE_FILE = REPO / "case_batch_summarisation" / "docker-compose.yaml"
NUM_TICKETS, ROWS_PER_SHARD = 24, 12
CONF = {"night": "ci-night", "num_tickets": NUM_TICKETS, "median_tokens": 30.0, "max_ticket_tokens": 120,
        "max_completion_tokens": 8, "rows_per_shard": ROWS_PER_SHARD}


@pytest.fixture(scope="module")
def batch_stack(images, tmp_path_factory):
    nights = tmp_path_factory.mktemp("nights")
    nights.chmod(0o777)  # the containers run as uid 1000
    ports = {name: str(free_port()) for name in ("AIRFLOW_PORT", "POSTGRES_PORT", "SCHEDULER_HEALTH_PORT")}
    env = {**os.environ, **images, **ports, "NIGHTS_VOLUME": str(nights), "BATCH_DAG_SCHEDULE": "none",
           "BATCH_RETRY_DELAY_S": "5"}
    timings = {"build_s": float(images["build_s"])}
    with compose_stack(COMPOSE_FILE, env, timings, wait_timeout_s=900):
        yield {"api": f"http://127.0.0.1:{ports['AIRFLOW_PORT']}", "nights": nights}


def test_night_through_airflow_every_custom_id_exactly_once(batch_stack):
    client = airflow_client(batch_stack["api"])
    run, states = run_night(client, CONF, timeout_s=900)
    assert run["state"] == "success", (run, states)
    assert states == {"prepare_night[-1]": "success", "split_night[-1]": "success",
                      "summarise_shard[0]": "success", "summarise_shard[1]": "success",
                      "validate_night[-1]": "success", "report_night[-1]": "success"}, states

    night = batch_stack["nights"] / CONF["night"]
    inputs = [json.loads(line)["custom_id"] for line in (night / "input.jsonl").read_text().splitlines()]
    assert len(inputs) == len(set(inputs)) == NUM_TICKETS
    rows = [json.loads(line) for p in sorted((night / "out").glob("shard-*.jsonl"))
            for line in p.read_text().splitlines()]
    assert Counter(r["custom_id"] for r in rows) == Counter(inputs)  # every custom_id exactly once
    for row in rows:  # OpenAI's batch output shape, each a successful greedy, schema-constrained summary
        assert row["error"] is None and row["id"] and row["response"]["status_code"] == 200, row
        body = row["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "ticket-summariser", body
        content = body["choices"][0]["message"]["content"]
        assert content.lstrip().startswith("{"), content  # response_format: json_schema
        assert 1 <= body["usage"]["completion_tokens"] <= CONF["max_completion_tokens"], body["usage"]
    manifest = json.loads((night / "shards" / shards.MANIFEST).read_text())
    assert shards.check_exactly_once(manifest, night / "shards", night / "out")["num_custom_ids"] == NUM_TICKETS
    report = json.loads((night / "report.json").read_text())
    assert report["num_shards"] == 2 and report["num_shards_skipped"] == 0, report
    assert report["num_rows"] == report["num_succeeded"] == NUM_TICKETS and report["num_failed"] == 0, report
    assert report["completion_tokens"] > 0 and report["cached_prompt_tokens"] > 0, report  # the instruction
    outputs = {p.name: p.read_bytes() for p in (night / "out").glob("shard-*.jsonl")}

    again, states = run_night(client, CONF, timeout_s=600)  # the same night again: finished shards are skipped
    assert again["state"] == "success", (again, states)
    report = json.loads((night / "report.json").read_text())
    assert report["num_shards_skipped"] == 2 and report["num_rows"] == NUM_TICKETS, report
    assert {p.name: p.read_bytes() for p in (night / "out").glob("shard-*.jsonl")} == outputs
