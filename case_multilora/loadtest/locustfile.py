"""Locust users for the multi-LoRA case: well-behaved tenants with true Zipf popularity and two whales bursting
on and off at 10x their quota, all through the gateway (so each request carries its tenant's API key).

    locust -f case_multilora/loadtest/locustfile.py --headless -u 10 -r 10 -t 90s --host http://127.0.0.1:8080 \
        --ml-tenants case_multilora/loadtest/out/tenants.json --ml-samples case_multilora/loadtest/out/samples.jsonl

`--ml-tenants` (JSON, written by run_loadtest.py): {"well_behaved": [{"name", "key"}, ...] in popularity order,
"whales": [{"name", "key", "quota_per_minute"}, ...]}. A well-behaved user picks each request's tenant at random
with P(k-th tenant) proportional to k^-s (`--ml-zipf-s`, default 1.1: true Zipf, not S-LoRA's uniform
`power(alpha=1)`), paced at one request per `--ml-pacing-s`. Whale users (`--ml-whale-users` per whale) are
bound to one whale each; during the ON half of every `--ml-burst-period-s` each sends at its share of 10x the
whale's quota, during the OFF half nothing. Every streamed request is timed by hand (TTFT to the first content
chunk, end to end) and written as one JSON line to `--ml-samples`; TTFT also appears as locust rows
("TTFT well-behaved", "TTFT whale"). A 429 counts as a refusal, not a failure.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

from locust import HttpUser, between, events, task
from zipf import zipf_choice  # locust puts this file's folder on sys.path

QUESTIONS = ["What do bees make?", "What colour is the sky?", "How many legs does a dog have?",
             "Where do fish live?", "What is two plus two?", "What do cows eat?", "Name a fruit.",
             "What is the largest ocean?"]
DOCUMENT = ("Summarise the following maintenance log in one sentence. " +
            "Pump {n} was inspected, the seals were replaced, the bearings were greased and the pressure was "
            "checked at every valve along the line before the system was restarted. " * 6)
_state: dict = {"tenants": None, "out": None, "started": time.time()}


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--ml-tenants", default="", help="tenants JSON (run_loadtest.py writes it)")
    parser.add_argument("--ml-samples", default="", help="JSON lines, one per request")
    parser.add_argument("--ml-zipf-s", type=float, default=1.1)
    parser.add_argument("--ml-pacing-s", type=float, default=8.0, help="well-behaved: one request per user per s")
    parser.add_argument("--ml-whale-users", type=int, default=4, help="users per whale")
    parser.add_argument("--ml-burst-period-s", type=float, default=30.0, help="whale ON for half of it, then OFF")
    parser.add_argument("--ml-max-tokens", type=int, default=16, help="well-behaved answers")
    parser.add_argument("--ml-whale-max-tokens", type=int, default=32)
    parser.add_argument("--ml-seed", type=int, default=0)
    parser.add_argument("--ml-ignore-eos", action="store_true", help="fixed answer lengths (random adapters)")


@events.test_start.add_listener
def _start(environment, **_) -> None:
    options = environment.parsed_options
    _state["tenants"] = json.loads(Path(options.ml_tenants).read_text())
    _state["out"] = open(options.ml_samples, "a") if options.ml_samples else None  # noqa: SIM115
    _state["started"] = time.time()


@events.test_stop.add_listener
def _stop(**_) -> None:
    if _state["out"]:
        _state["out"].close()
        _state["out"] = None


class _TenantUser(HttpUser):
    abstract = True

    def stream(self, kind: str, tenant: dict, messages: list, max_tokens: int) -> None:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.environment.parsed_options.ml_ignore_eos:
            body["ignore_eos"] = True  # every answer max_tokens long: equal work with or without adapters
        sample = {"kind": kind, "tenant": tenant["name"], "t_s": round(time.time() - _state["started"], 3)}
        start = time.perf_counter()
        ttft = None
        with self.client.post("/v1/chat/completions", json=body, stream=True, catch_response=True,
                              headers={"Authorization": f"Bearer {tenant['key']}"}, name=f"chat {kind}") as r:
            sample["status"] = r.status_code
            if r.status_code == 429:
                r.success()
                sample["retry_after"] = r.headers.get("Retry-After")
            elif r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")
            else:
                for line in r.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        sample["status"] = chunk["error"].get("code")
                        r.failure(str(chunk["error"])[:200])
                    elif ttft is None and any(c.get("delta", {}).get("content") or c.get("text")
                                              for c in chunk.get("choices") or []):
                        ttft = time.perf_counter() - start  # the first token, not the role-only first chunk
                    elif chunk.get("usage"):
                        sample["completion_tokens"] = chunk["usage"]["completion_tokens"]
                        sample["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
        sample["e2e_s"] = round(time.perf_counter() - start, 4)
        if ttft is not None:
            sample["ttft_s"] = round(ttft, 4)
            events.request.fire(request_type="TTFT", name=kind, response_time=ttft * 1000, response_length=0,
                                exception=None, context={})
        if _state["out"]:
            _state["out"].write(json.dumps(sample) + "\n")
            _state["out"].flush()


class WellBehaved(_TenantUser):
    weight = 1

    def wait_time(self) -> float:
        pacing = self.environment.parsed_options.ml_pacing_s
        return max(0.0, pacing - (time.perf_counter() - self._began))

    def on_start(self) -> None:
        self.rng = random.Random(self.environment.parsed_options.ml_seed * 1000 + id(self) % 997)
        self._began = time.perf_counter()

    @task
    def ask(self) -> None:
        self._began = time.perf_counter()
        tenants = _state["tenants"]["well_behaved"]
        tenant = tenants[zipf_choice(self.rng, len(tenants), self.environment.parsed_options.ml_zipf_s)]
        question = self.rng.choice(QUESTIONS)
        self.stream("well-behaved", tenant, [{"role": "user", "content": question}],
                    self.environment.parsed_options.ml_max_tokens)


class Whale(_TenantUser):
    # whale users in all (run_loadtest.py sets it: whales x --ml-whale-users); -u counts them, the rest well-behaved
    fixed_count = int(os.environ.get("ML_WHALE_USERS_TOTAL", "0"))
    wait_time = between(0, 0)
    _next_index = 0

    def on_start(self) -> None:
        whales = _state["tenants"]["whales"]
        self.tenant = whales[Whale._next_index % len(whales)]
        Whale._next_index += 1
        opts = self.environment.parsed_options
        # 10x the quota, shared by this whale's users: each paces one request per `interval` seconds
        self.interval = opts.ml_whale_users * 60.0 / (10 * self.tenant["quota_per_minute"])
        self.n = 0

    @task
    def flood(self) -> None:
        opts = self.environment.parsed_options
        period = opts.ml_burst_period_s
        phase = (time.time() - _state["started"]) % period
        if phase >= period / 2:  # OFF: sleep to the next burst
            time.sleep(period - phase)
            return
        began = time.perf_counter()
        self.n += 1
        self.stream("whale", self.tenant, [{"role": "user", "content": DOCUMENT.format(n=f"{id(self)}-{self.n}")}],
                    opts.ml_whale_max_tokens)
        time.sleep(max(0.0, self.interval - (time.perf_counter() - began)))
