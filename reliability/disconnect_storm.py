"""Disconnect storm: many streams aborted at random points, then the engine must hold no KV blocks and no
requests (K11 in shared/bugs/handed.md, at scale).

    python -m reliability.disconnect_storm --streams 1000      # starts a local server on the default model
    python -m reliability.disconnect_storm --url http://127.0.0.1:8000 --streams 200

Each stream is one request (completions or chat, streamed or not, n 1 or 2, max_tokens 8-32, ignore_eos so
that it runs its whole length unless aborted) that the client abandons at a random point: before the
response headers (after 0-300 ms), after k SSE chunks (k uniform in 0..max_tokens), or never (read to the
end: the control group). `--concurrency` streams are open at once. Afterwards the server's gauges must
read `vllm:num_requests_running` 0, `vllm:num_requests_waiting` 0 and `vllm:kv_cache_usage_perc` 0 (no
block held by any request: freed prefix-cache blocks count as free) within `--settle-s`; leaked blocks =
usage x the pool's blocks (`--num-gpu-blocks-override` fixes the pool's size). Then one request must be
served. Bounded: every request has a 120 s timeout, the storm stops after `--max-s`. The first three
streams take one abort mode each (before the headers, mid-stream, read to the end), the rest draw theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROMPTS = ["Write a long story about a lighthouse keeper.", "List every country in Europe with its capital.",
           "Explain how a paged KV cache works, step by step.", "Count from one to one hundred in words."]


@dataclass
class StormReport:
    streams: int = 0
    aborted_before_headers: int = 0
    aborted_mid_stream: int = 0
    completed: int = 0
    client_errors: int = 0          # non-200 responses or transport errors other than our own aborts
    first_errors: list[str] = field(default_factory=list)
    storm_s: float = 0.0
    settle_s: float | None = None   # from the last abort to idle gauges; None: never idle
    after: dict = field(default_factory=dict)
    next_request_ok: bool = False

    @property
    def idle(self) -> bool:
        return self.settle_s is not None


def metrics(client: httpx.Client) -> dict[str, float]:
    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    out = {}
    for line in client.get("/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0]
        if name in wanted:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def _body(rng: random.Random) -> tuple[str, dict]:
    max_tokens = rng.randint(8, 32)
    common = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": rng.choice([0.0, 0.8]),
              "n": rng.choice([1, 1, 1, 2]), "stream": rng.random() < 0.85}
    prompt = rng.choice(PROMPTS)
    if rng.random() < 0.5:
        return "/v1/completions", {"prompt": prompt, **common}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **common}


MODES = ["headers", "mid", "complete"]


async def _one(client: httpx.AsyncClient, rng: random.Random, report: StormReport, mode: str | None = None) -> None:
    path, body = _body(rng)
    mode = mode or rng.choices(MODES, weights=[2, 7, 1])[0]
    report.streams += 1
    try:
        if mode == "headers":
            try:
                await asyncio.wait_for(client.post(path, json=body), timeout=rng.uniform(0.0, 0.3))
            except TimeoutError:
                report.aborted_before_headers += 1
                return
            report.completed += 1  # answered within the delay: not aborted
            return
        stop_after = rng.randint(0, body["max_tokens"]) if mode == "mid" else None
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            chunks = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    chunks += 1
                    if stop_after is not None and chunks > stop_after:
                        report.aborted_mid_stream += 1
                        return  # leaving the block closes the connection mid-response
        report.completed += 1
    except Exception as exc:  # noqa: BLE001 - counted, the storm goes on
        report.client_errors += 1
        if len(report.first_errors) < 5:
            report.first_errors.append(f"{type(exc).__name__}: {exc}"[:300])


async def storm(url: str, streams: int, concurrency: int, seed: int, max_s: float) -> StormReport:
    report = StormReport()
    rng = random.Random(seed)
    deadline = time.monotonic() + max_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        queue = iter(range(streams))

        async def worker() -> None:
            for i in queue:
                if time.monotonic() > deadline:
                    return
                # the first streams take one mode each: a short storm (the CI test's) has all three
                await _one(client, rng, report, MODES[i] if i < len(MODES) else None)

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        report.storm_s = round(time.monotonic() - start, 1)
    return report


def settle(url: str, report: StormReport, settle_s: float) -> StormReport:
    """Poll the gauges until no request runs or waits and no block is held (bounded by `settle_s`)."""
    start = time.monotonic()
    with httpx.Client(base_url=url) as client:
        while True:
            report.after = metrics(client)
            if (report.after.get("vllm:num_requests_running") == 0 and report.after.get("vllm:num_requests_waiting")
                    == 0 and report.after.get("vllm:kv_cache_usage_perc") == 0):
                report.settle_s = round(time.monotonic() - start, 2)
                break
            if time.monotonic() - start > settle_s:
                break
            time.sleep(0.1)
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=120)
        report.next_request_ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    return report


def run(url: str, streams: int, concurrency: int = 32, seed: int = 0, max_s: float = 1800,
        settle_s: float = 30) -> StormReport:
    return settle(url, asyncio.run(storm(url, streams, concurrency, seed, max_s)), settle_s)


def main(argv: list[str] | None = None) -> int:
    from reliability.local_server import local_server
    from reliability.results import RESULTS, add_append_argument, save

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (default: start one on the default model)")
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-s", type=float, default=1800)
    p.add_argument("--settle-s", type=float, default=30)
    p.add_argument("--num-gpu-blocks-override", type=int, default=1024)
    p.add_argument("--out", type=Path, default=RESULTS)
    add_append_argument(p, "disconnect_storm")
    args = p.parse_args(argv)
    flags = ["--max-model-len", "1024", "--num-gpu-blocks-override", str(args.num_gpu_blocks_override)]
    with local_server(flags, url=args.url) as url:
        report = run(url, args.streams, args.concurrency, args.seed, args.max_s, args.settle_s)
    usage = report.after.get("vllm:kv_cache_usage_perc", 1.0)
    section = {
        "config": {"server": "python -m shared_engine serve " + " ".join(flags), "streams": args.streams,
                   "concurrency": args.concurrency, "seed": args.seed,
                   "requests": "completions or chat, 85% streamed, n 1 (75%) or 2, max_tokens 8-32, ignore_eos",
                   "abort_points": "20% before headers (0-300 ms), 70% after k chunks (k uniform 0..max_tokens), "
                                   "10% read to the end"},
        **{k: v for k, v in vars(report).items()},
        "leaked_kv_blocks": round(usage * args.num_gpu_blocks_override),
        "stuck_requests": int(report.after.get("vllm:num_requests_running", -1)
                              + report.after.get("vllm:num_requests_waiting", 0)),
    }
    save("disconnect_storm", section, args.out, args.append_to)
    print(section)
    ok = report.idle and report.next_request_ok and report.client_errors == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
