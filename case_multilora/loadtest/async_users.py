"""The locustfile's users on asyncio + httpx (no locust, gevent or flask: the H200 device has httpx only).

Same behaviour and the same sample lines as `locustfile.py`: well-behaved users pick each request's tenant by
true Zipf (s 1.1) and pace one request per `pacing_s`; whale users are bound to one whale each and, in the ON
half of every `burst_period_s`, each send at its share of 10x the whale's quota, nothing in the OFF half.
Every request streams; TTFT is the first content chunk (not the role-only first chunk), e2e the last byte.
A run stops at `duration_s` sharp: requests still open are cancelled and written with status "incomplete"
and the seconds they had waited (`waited_s`, a lower bound on their latency; without them a starved run's
tail would look short).

    python case_multilora/loadtest/async_users.py --host URL --tenants tenants.json --samples out.jsonl \
        --duration-s 60 --well-behaved-users 48 --whale-users 8 --pacing-s 4 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from case_multilora.loadtest.zipf import zipf_choice

QUESTIONS = ["What do bees make?", "What colour is the sky?", "How many legs does a dog have?",
             "Where do fish live?", "What is two plus two?", "What do cows eat?", "Name a fruit.",
             "What is the largest ocean?"]
DOCUMENT = ("Summarise the following maintenance log in one sentence. " +
            "Pump {n} was inspected, the seals were replaced, the bearings were greased and the pressure was "
            "checked at every valve along the line before the system was restarted. " * 6)


@dataclass(frozen=True)
class LoadShape:
    """Users and request shapes. Times in seconds; `whale_users` per whale (0: no whales)."""

    duration_s: float
    well_behaved_users: int
    whale_users: int
    pacing_s: float = 8.0
    max_tokens: int = 16
    whale_max_tokens: int = 32
    burst_period_s: float = 30.0
    zipf_s: float = 1.1
    ignore_eos: bool = False
    seed: int = 0
    whale_process: bool = False  # the whales' users in a process (and event loop) of their own

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.well_behaved_users < 0 or self.whale_users < 0 or self.pacing_s <= 0:
            raise ValueError(f"bad load shape: {self}")


class _Run:
    def __init__(self, client: httpx.AsyncClient, shape: LoadShape, out, started: float | None = None) -> None:
        self.client, self.shape, self.out = client, shape, out
        self.started = time.monotonic() if started is None else started  # CLOCK_MONOTONIC: one per machine
        self.deadline = self.started + shape.duration_s

    def write(self, sample: dict) -> None:
        self.out.write(json.dumps(sample) + "\n")

    async def stream(self, kind: str, tenant: dict, content: str, max_tokens: int) -> None:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}}
        if self.shape.ignore_eos:
            body["ignore_eos"] = True
        sample = {"kind": kind, "tenant": tenant["name"], "t_s": round(time.monotonic() - self.started, 3)}
        start = time.perf_counter()
        try:
            async with self.client.stream("POST", "/v1/chat/completions", json=body,
                                          headers={"Authorization": f"Bearer {tenant['key']}"}) as r:
                sample["status"] = r.status_code
                if r.status_code == 429:
                    sample["retry_after"] = r.headers.get("Retry-After")
                    await r.aread()
                elif r.status_code != 200:
                    sample["error"] = (await r.aread()).decode(errors="replace")[:200]
                else:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            sample["status"] = chunk["error"].get("code")
                        elif "ttft_s" not in sample and any(c.get("delta", {}).get("content") or c.get("text")
                                                            for c in chunk.get("choices") or []):
                            sample["ttft_s"] = round(time.perf_counter() - start, 4)
                        elif chunk.get("usage"):
                            sample["completion_tokens"] = chunk["usage"]["completion_tokens"]
                            sample["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
        except httpx.HTTPError as e:
            sample["status"] = f"transport: {type(e).__name__}"
        except asyncio.CancelledError:  # the run's deadline: still waiting or still streaming
            self.write({**sample, "status": "incomplete", "waited_s": round(time.perf_counter() - start, 4)})
            raise
        sample["e2e_s"] = round(time.perf_counter() - start, 4)
        self.write(sample)

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, min(t, self.deadline) - time.monotonic()))

    async def well_behaved(self, index: int, tenants: list[dict]) -> None:
        rng = random.Random(self.shape.seed * 1000 + index)
        await asyncio.sleep(rng.uniform(0, self.shape.pacing_s))  # users spread over one pacing interval
        while time.monotonic() < self.deadline:
            began = time.monotonic()
            tenant = tenants[zipf_choice(rng, len(tenants), self.shape.zipf_s)]
            await self.stream("well-behaved", tenant, rng.choice(QUESTIONS), self.shape.max_tokens)
            await self.sleep_until(began + self.shape.pacing_s)

    async def whale(self, index: int, tenant: dict) -> None:
        period = self.shape.burst_period_s
        interval = self.shape.whale_users * 60.0 / (10 * tenant["quota_per_minute"])  # 10x the quota in all
        n = 0
        while time.monotonic() < self.deadline:
            phase = (time.monotonic() - self.started) % period
            if phase >= period / 2:  # OFF: sleep to the next burst
                await self.sleep_until(time.monotonic() + period - phase)
                continue
            began = time.monotonic()
            n += 1
            await self.stream("whale", tenant, DOCUMENT.format(n=f"{index}-{n}"), self.shape.whale_max_tokens)
            await self.sleep_until(began + interval)


async def run(host: str, tenants: dict, shape: LoadShape, samples: Path) -> int:
    """Run the users against `host` (the gateway) for `shape.duration_s`; append one JSON line per request to
    `samples`. `tenants`: {"well_behaved": [{"name", "key"}, ...] in popularity order, "whales": [{"name",
    "key", "quota_per_minute"}, ...]} (run_loadtest.tenants_files writes it). Returns the lines written.
    `shape.whale_process`: the whales' users run in a child process with its own event loop and client (as
    other customers' clients would), so that parsing their streams (8 x 256 tokens at a time in the H200
    profile) does not delay this loop's well-behaved first-token timestamps; their lines are appended after."""
    child = None
    if shape.whale_process and tenants["whales"] and shape.whale_users:
        whale_samples = samples.with_name(samples.name + ".whales")
        whale_samples.unlink(missing_ok=True)
        context = multiprocessing.get_context("spawn")
        ready, go = context.Queue(), context.Queue()
        child = context.Process(target=_whales_main, args=(host, tenants, shape, str(whale_samples), ready, go))
        child.start()
        ready.get(timeout=120)  # its imports done: a spawned child on a loaded machine takes seconds to start
        started = time.monotonic()  # CLOCK_MONOTONIC: one clock for both processes
        go.put(started)
    else:
        started = time.monotonic()
    await _users(host, tenants, shape, samples, started, well_behaved=True, whales=child is None)
    if child is not None:
        child.join(timeout=120)
        if child.is_alive():
            child.kill()
        if whale_samples.exists():
            with open(samples, "a") as out:
                out.write(whale_samples.read_text())
            whale_samples.unlink()
    return sum(1 for _ in open(samples))


def _whales_main(host: str, tenants: dict, shape: LoadShape, samples: str, ready, go) -> None:
    """The child's entry: say it is up, wait for the phase's start time, run the whales' users until its end."""
    ready.put(True)
    started = go.get(timeout=120)
    asyncio.run(_users(host, tenants, shape, Path(samples), started, well_behaved=False, whales=True))


async def _users(host: str, tenants: dict, shape: LoadShape, samples: Path, started: float, well_behaved: bool,
                 whales: bool) -> None:
    users = shape.well_behaved_users + len(tenants["whales"]) * shape.whale_users
    limits = httpx.Limits(max_connections=users + 8, max_keepalive_connections=users + 8)
    timeout = httpx.Timeout(shape.duration_s + 60, connect=30)
    with open(samples, "a") as out:
        async with httpx.AsyncClient(base_url=host, limits=limits, timeout=timeout) as client:
            state = _Run(client, shape, out, started)
            tasks = [asyncio.create_task(state.well_behaved(i, tenants["well_behaved"]))
                     for i in range(shape.well_behaved_users if well_behaved else 0)]
            tasks += [asyncio.create_task(state.whale(w * shape.whale_users + i, whale))
                      for w, whale in enumerate(tenants["whales"] if whales else []) for i in range(shape.whale_users)]
            await asyncio.sleep(max(0.0, state.deadline - time.monotonic()))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", required=True)
    p.add_argument("--tenants", type=Path, required=True)
    p.add_argument("--samples", type=Path, required=True)
    p.add_argument("--duration-s", type=float, required=True)
    p.add_argument("--well-behaved-users", type=int, default=4)
    p.add_argument("--whale-users", type=int, default=0, help="per whale; 0: no whales")
    p.add_argument("--pacing-s", type=float, default=8.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--whale-max-tokens", type=int, default=32)
    p.add_argument("--burst-period-s", type=float, default=30.0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--whale-process", action="store_true", help="the whales' users in a process of their own")
    args = p.parse_args(argv)
    shape = LoadShape(args.duration_s, args.well_behaved_users, args.whale_users, args.pacing_s, args.max_tokens,
                      args.whale_max_tokens, args.burst_period_s, ignore_eos=args.ignore_eos,
                      whale_process=args.whale_process)
    print(asyncio.run(run(args.host, json.loads(args.tenants.read_text()), shape, args.samples)), "samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
