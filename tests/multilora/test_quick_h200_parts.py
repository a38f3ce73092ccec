"""The pieces of the six-minute H200 run (loadtest/h200_quick.sh) that run on the CPU: the asyncio users against
the gateway and the fake engine (both kinds send, the whale over its quota gets 429s, Zipf order; the whales in
the same process or their own), requests
still open at the deadline written as incomplete with their wait (and counted in the censored p99), the widened
tokenizer (every id decodes to text, encoding unchanged), and the engine configs the run builds."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest
from fastapi import FastAPI

from case_multilora.app.server import create_app
from case_multilora.app.settings import GatewaySettings
from case_multilora.app.tenants import Tenant, TenantRegistry, key_digest
from case_multilora.loadtest import h200_quick
from case_multilora.loadtest.async_users import LoadShape, run
from case_multilora.loadtest.run_loadtest import summarise
from case_multilora.loadtest.wide_tokenizer import widen
from tests.server.uvicorn_thread import serve_in_thread

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("whale_process", [False, True])
def test_async_users_write_samples_and_whales_hit_their_quota(fake_engine, tmp_path, whale_process):
    _, engine_url = fake_engine
    names = ["t1", "t2", "t3", "w1"]
    registry = TenantRegistry([Tenant(n, key_digest(f"k-{n}"), "upper", request_limit="6/minute")
                               if n == "w1" else Tenant(n, key_digest(f"k-{n}"), "upper") for n in names])
    spec = {"well_behaved": [{"name": n, "key": f"k-{n}", "quota_per_minute": 6} for n in names[:3]],
            "whales": [{"name": "w1", "key": "k-w1", "quota_per_minute": 60}]}  # sends 10/s; the gateway allows 6/min
    samples = tmp_path / "samples.jsonl"
    shape = LoadShape(duration_s=3.0, well_behaved_users=3, whale_users=2, pacing_s=0.05, burst_period_s=60.0,
                      whale_process=whale_process)  # True: the whales' users in a child process, lines appended
    with serve_in_thread(create_app(GatewaySettings(engine_url=engine_url), registry)) as url:
        written = asyncio.run(run(url, spec, shape, samples))
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert written == len(rows) > 20
    by_kind = collections.Counter((r["kind"], r["status"]) for r in rows)
    assert by_kind[("whale", 200)] == 6 and by_kind[("whale", 429)] >= 5, by_kind
    done = [r for r in rows if r["kind"] == "well-behaved" and r["status"] == 200]
    assert done and all(r["ttft_s"] > 0 and r["completion_tokens"] == 3 and r["e2e_s"] >= r["ttft_s"] for r in done)
    assert all(r["status"] in (200, "incomplete") for r in rows if r["kind"] == "well-behaved")
    per_tenant = collections.Counter(r["tenant"] for r in done)
    assert per_tenant["t1"] > per_tenant["t3"], per_tenant
    assert all(0 <= r["t_s"] <= 3.1 for r in rows)  # one clock for both processes
    assert not (tmp_path / "samples.jsonl.whales").exists()


def test_requests_open_at_the_deadline_are_written_incomplete(tmp_path):
    hang = FastAPI()

    @hang.post("/v1/chat/completions")
    async def never():
        await asyncio.sleep(30)

    spec = {"well_behaved": [{"name": "t1", "key": "k"}], "whales": []}
    samples = tmp_path / "samples.jsonl"
    with serve_in_thread(hang) as url:
        asyncio.run(run(url, spec, LoadShape(duration_s=1.5, well_behaved_users=3, whale_users=0, pacing_s=0.1),
                        samples))
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 3 and all(r["status"] == "incomplete" and 0 < r["waited_s"] <= 1.6 for r in rows), rows
    summary = summarise(rows, 1.5)["well-behaved"]
    assert summary["num_incomplete"] == summary["num_incomplete_without_first_token"] == 3
    assert summary["p99_ttft_ms"] is None  # no first token at all ...
    assert summary["p99_ttft_ms_censored"] == pytest.approx(max(r["waited_s"] for r in rows) * 1000, abs=0.2)


def test_widened_tokenizer_decodes_every_id_and_encodes_as_before(tmp_path):
    from shared_engine.engine.tokenizer import apply_chat_template, load_tokenizer
    from shared_engine.model_loader.default_model import default_model_dir

    src = default_model_dir()
    assert widen(src, tmp_path, 49_200) == 48
    wide, narrow = load_tokenizer(tmp_path), load_tokenizer(src)
    assert len(wide) == 49_200
    assert narrow.decode([49_199]) == "" and wide.decode([49_152, 49_199]) == " t49152 t49199"
    messages = [{"role": "user", "content": "What do bees make? t49199"}]
    assert apply_chat_template(wide, messages) == apply_chat_template(narrow, messages)
    with pytest.raises(ValueError, match="already uses ids"):
        widen(src, tmp_path / "again", 1_000)


def test_engine_configs_of_the_quick_run(tmp_path):
    fix = h200_quick.engine_config("the_fix", None, None, tmp_path, ["max_num_batched_tokens=512"])
    first = h200_quick.engine_config("first_attempt", "smollm2-135m", "auto", tmp_path, [])
    assert (fix["model"], fix["max_loras"], fix["scheduling_policy"]) == ("llama-3.1-8b", 32, "fair")
    assert fix["max_num_batched_tokens"] == 512 and fix["tokenizer"] == str(tmp_path.resolve())
    assert (first["model"], first["dtype"], first["max_loras"], first["scheduling_policy"]) == (
        "smollm2-135m", "auto", 1, "fcfs")
    assert len(fix["lora_modules"]) == len(first["lora_modules"]) == 30
    with pytest.raises(SystemExit):
        h200_quick.main(["--adapters-dir", str(tmp_path / "missing"), "--tokenizer", str(tmp_path)])
