"""The HTTP path's share of the well-behaved tenants' TTFT while whales stream (CPU micro-benchmark, no model).

A fake engine (its own process: uvicorn, FastAPI) streams SSE chunks the way the engine's OpenAI server
does (`shared_engine.entrypoints.openai.streaming.sse` of a `ChatCompletionChunk`, one per token) on a
shared step clock: every `--step-ms` each open stream gets one token, all in the same loop iteration, as an
engine step hands every running request its token at once; a new request's first token comes one step
after it arrives (its prefill). The gateway (`case_multilora.app`, its own process) sits in front. The
whales (a process of their own, like other customers' clients) hold `--whales` streams open, each asking
`--whale-tokens` tokens and asking again when done; the well-behaved users (this process, `--users`
concurrent, one `--max-tokens` request each per `--pacing-ms`) measure TTFT (first content chunk, as
async_users.py does) and end-to-end time. Four cells: {direct to the fake engine, through the gateway} x
{whales off, whales on}, `--requests` well-behaved requests each.

    nice -n 19 python case_multilora/loadtest/http_path_bench.py --whales 64 --step-ms 25 \
        --out case_multilora/loadtest/http_path_bench.json --label after

`--relay-only`: just the relay step's CPU per chunk, the old per-line relay against relay.py (no servers).
`--http h11 --loop asyncio` (the default) is what the H200 device runs (no uvloop or httptools there: see
h200_quick.sh); `--http httptools --loop uvloop` where they are installed. Times in ms. What it cannot show:
the real engine core's IPC and detokenisation, and the H200 host's 16 free cores (here every process shares
the CPU with the others and with whatever else runs: `load_average_before` in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from case_multilora.app.tenants import key_digest  # noqa: E402
from case_multilora.loadtest.fake_step_engine import fake_engine_app  # noqa: E402
from case_multilora.services import free_port  # noqa: E402

WELL_BEHAVED = [f"wb{i}" for i in range(4)]
WHALES = ["whale0", "whale1"]


def tenants_file(path: Path) -> Path:
    """Well-behaved tenants with limits (the limiter runs on their path), whales without (they hold
    `--whales` streams; in the case they would get 429s past their concurrency)."""
    rows = [{"name": n, "api_key_sha256": key_digest(f"sk-{n}"), "adapter": n, "request_limit": "100000/minute",
             "token_limit": "10000000/minute", "max_concurrency": 64} for n in WELL_BEHAVED]
    rows += [{"name": n, "api_key_sha256": key_digest(f"sk-{n}"), "adapter": n} for n in WHALES]
    path.write_text(yaml.safe_dump({"tenants": rows}))
    return path


def serve_child(role: str, port: int, args: argparse.Namespace) -> None:
    import uvicorn

    if role == "engine":
        app = fake_engine_app(args.step_ms / 1000, args.engine_chunks)
    else:
        from case_multilora.app.server import create_app
        from case_multilora.app.settings import GatewaySettings

        app = create_app(GatewaySettings.from_env())
    profile = os.environ.get("HTTP_BENCH_PROFILE") if role == "gateway" else None
    if profile:
        import cProfile
        import signal
        prof = cProfile.Profile()

        def dump(*_) -> None:  # uvicorn re-raises SIGTERM after its graceful shutdown
            prof.disable()
            prof.dump_stats(profile)
            os._exit(0)

        signal.signal(signal.SIGTERM, dump)
        prof.enable()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop=args.loop, http=args.http)


def start(role: str, args: argparse.Namespace, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", role, "--port", str(port), "--step-ms", str(args.step_ms),
           "--http", args.http, "--loop", args.loop, "--engine-chunks", args.engine_chunks]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{role} did not start")


# ---- clients -----------------------------------------------------------------------------------------------
async def one_request(client: httpx.AsyncClient, tenant: str, max_tokens: int, counter: list | None = None) -> dict:
    body = {"model": tenant, "messages": [{"role": "user", "content": "What do bees make?"}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    sample = {"tenant": tenant}
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer sk-{tenant}"}) as r:
        sample["status"] = r.status_code
        async for line in r.aiter_lines():
            if counter is not None and line:
                counter[0] += 1
            if "ttft_ms" not in sample and line.startswith("data: {") and '"content": " tok"' in line:
                sample["ttft_ms"] = (time.perf_counter() - start) * 1000
    sample["e2e_ms"] = (time.perf_counter() - start) * 1000
    return sample


def whales_main(url: str, streams: int, tokens: int, ready, stop, chunks) -> None:
    """`streams` whale streams until `stop`; `chunks` gets the SSE events they received after `ready`."""
    counter = [0]

    async def main() -> None:
        limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
            async def whale(i: int) -> None:
                tenant = WHALES[i % len(WHALES)]
                await asyncio.sleep(random.uniform(0, 0.5))  # spread over the token clock
                while not stop.is_set():
                    await one_request(client, tenant, tokens, counter)

            tasks = [asyncio.create_task(whale(i)) for i in range(streams)]
            await asyncio.sleep(1.5)
            counter[0] = 0
            ready.set()
            while not stop.is_set():
                chunks.value = counter[0]
                await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    chunks.value = counter[0]


async def well_behaved(url: str, args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def user(i: int) -> None:
            rng = random.Random(i)
            await asyncio.sleep(rng.uniform(0, args.pacing_ms / 1000))
            while len(rows) < args.requests:
                began = time.monotonic()
                rows.append(await one_request(client, WELL_BEHAVED[i % len(WELL_BEHAVED)], args.max_tokens))
                await asyncio.sleep(max(0.0, began + args.pacing_ms / 1000 * rng.uniform(0.5, 1.5) - time.monotonic()))

        await one_request(client, WELL_BEHAVED[0], 2)  # the connection pool warm
        await asyncio.gather(*(user(i) for i in range(args.users)))
    return rows


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cell(url: str, args: argparse.Namespace, whales: int, servers: dict[str, int]) -> dict:
    ctx = multiprocessing.get_context("spawn")
    ready, stop, whale_chunks = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
    child = None
    if whales:
        child = ctx.Process(target=whales_main, args=(url, whales, args.whale_tokens, ready, stop, whale_chunks))
        child.start()
        ready.wait(60)
    probe = {}
    if whales and args.probe_s > 0:  # the servers' CPU per whale chunk, before any well-behaved request
        before, chunks0, t0 = {name: cpu_s(pid) for name, pid in servers.items()}, whale_chunks.value, time.monotonic()
        time.sleep(args.probe_s)
        n, dt = whale_chunks.value - chunks0, time.monotonic() - t0
        probe = {"whale_chunks_per_s": round(n / dt), "cpu_us_per_whale_chunk": {
            name: round((cpu_s(pid) - before[name]) * 1e6 / max(n, 1), 1) for name, pid in servers.items()}}
    load = os.getloadavg()[0]
    started, cpu_before = time.monotonic(), {name: cpu_s(pid) for name, pid in servers.items()}
    chunks_before = whale_chunks.value
    try:
        rows = asyncio.run(well_behaved(url, args))
        elapsed, whale_chunks_in_cell = time.monotonic() - started, whale_chunks.value - chunks_before
        cpu = {name: round((cpu_s(pid) - cpu_before[name]) / elapsed, 3) for name, pid in servers.items()}
    finally:
        stop.set()
        if child is not None:
            child.join(30)
            if child.is_alive():
                child.kill()
    ttft = [r["ttft_ms"] for r in rows if r.get("status") == 200 and "ttft_ms" in r]
    chunks_per_s = (whale_chunks_in_cell + len(rows) * (args.max_tokens + 3)) / elapsed  # events received
    return {**probe, "cpu_cores_used": cpu, "chunks_per_s": round(chunks_per_s),
            "cpu_us_per_chunk": {name: round(c * 1e6 / chunks_per_s, 1) for name, c in cpu.items()},
            "whale_streams": whales, "requests": len(rows), "ok": len(ttft), "elapsed_s": round(elapsed, 1),
            "load_average_1m": round(load, 2), "ttft_ms": {"p50": quantile(ttft, 0.5), "p90": quantile(ttft, 0.9),
                                                           "p99": quantile(ttft, 0.99),
                                                           "mean": round(statistics.fmean(ttft), 2)},
            "e2e_ms_p50": quantile([r["e2e_ms"] for r in rows], 0.5)}


def relay_only(repeats: int = 40) -> dict:
    """CPU microseconds per chunk of the gateway's relay step alone (no sockets): the per-line relay it had
    until 2026-12-02 (httpx aiter_lines, json.loads of every chunk) against relay.py's, on one 256-token stream
    read one event at a time (an engine step's token each)."""
    from case_multilora.app.relay import SseRelay
    from shared_engine.entrypoints.openai.protocol import ChatChunkChoice, ChatCompletionChunk, DeltaMessage, Usage
    from shared_engine.entrypoints.openai.streaming import DONE, sse

    def event(delta=None, usage=None) -> bytes:
        choices = [] if usage else [ChatChunkChoice(index=0, delta=delta)]
        return sse(ChatCompletionChunk(id="chatcmpl-x", created=1, model="t3", choices=choices, usage=usage)).encode()

    events = [event(DeltaMessage(role="assistant", content=""))] + [event(DeltaMessage(content=" tok"))] * 256
    events += [event(usage=Usage(prompt_tokens=3, completion_tokens=256, total_tokens=259)), DONE.encode()]

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self):
            for e in events:
                yield e

    async def per_line() -> None:
        first = True
        async for line in httpx.Response(200, stream=Body()).aiter_lines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("usage") and chunk.get("choices") == []:
                    continue
                if "error" not in chunk and first and any(c.get("delta", {}).get("content")
                                                          for c in chunk.get("choices") or []):
                    first = False
                f"data: {line[6:]}\n\n".encode()

    async def relay_py() -> None:
        relay = SseRelay(False, lambda: None)
        async for data in httpx.Response(200, stream=Body()).aiter_bytes():
            relay.feed(data)
        relay.close()

    out = {}
    for name, fn in (("per_line", per_line), ("relay_py", relay_py)) * 2:  # the second round counts
        t = time.process_time()
        for _ in range(repeats):
            asyncio.run(fn())
        out[name] = round((time.process_time() - t) * 1e6 / (repeats * len(events)), 1)
    return {"relay_cpu_us_per_chunk": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--whales", type=int, default=64, help="whale streams held open")
    p.add_argument("--whale-tokens", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=25.0, help="the fake engine's step: one token per stream")
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--requests", type=int, default=200, help="well-behaved requests per cell")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--pacing-ms", type=float, default=150.0)
    p.add_argument("--http", default="h11", choices=["h11", "httptools", "auto"])
    p.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop", "auto"])
    p.add_argument("--targets", default="direct,gateway")
    p.add_argument("--engine-chunks", default="models", choices=["models", "plain"],
                   help="the fake engine's token chunks: pydantic models (as before ChatContentChunks) or plain")
    p.add_argument("--profile-gateway", type=Path, default=None, help="cProfile the gateway process to this file")
    p.add_argument("--probe-s", type=float, default=4.0,
                   help="with whales on: the servers' CPU per whale chunk over this long, before the users start")
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path, default=None, help="append this run to a results JSON")
    p.add_argument("--serve", choices=["engine", "gateway"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--relay-only", action="store_true", help="just the relay step's CPU per chunk, old vs relay.py")
    args = p.parse_args(argv)
    if args.relay_only:
        print(json.dumps(relay_only()))
        return 0
    if args.serve:
        serve_child(args.serve, args.port, args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="http-path-bench-"))
    engine, engine_url = start("engine", args)
    procs = [engine]
    try:
        gateway_env = {"ENGINE_URL": engine_url, "TENANTS_FILE": str(tenants_file(work / "tenants.yaml"))}
        if args.profile_gateway:
            gateway_env["HTTP_BENCH_PROFILE"] = str(args.profile_gateway.resolve())
        gateway, gateway_url = start("gateway", args, gateway_env)
        procs.append(gateway)
        cells = {}
        for target in args.targets.split(","):
            url = engine_url if target == "direct" else gateway_url
            for whales in (0, args.whales):
                name = f"{target}_whales_{'on' if whales else 'off'}"
                cells[name] = cell(url, args, whales, {"engine": engine.pid, "gateway": gateway.pid})
                print(name, json.dumps(cells[name]), flush=True)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)
    ratios = {}
    for target in args.targets.split(","):
        off, on = cells[f"{target}_whales_off"]["ttft_ms"], cells[f"{target}_whales_on"]["ttft_ms"]
        ratios[target] = {q: round(on[q] / off[q], 3) for q in ("p50", "p99")}
    if "gateway" in ratios and "direct" in ratios:
        ratios["gateway_added_ms_whales_on"] = {
            q: round(cells["gateway_whales_on"]["ttft_ms"][q] - cells["direct_whales_on"]["ttft_ms"][q], 2)
            for q in ("p50", "p99")}
        ratios["gateway_added_ms_whales_off"] = {
            q: round(cells["gateway_whales_off"]["ttft_ms"][q] - cells["direct_whales_off"]["ttft_ms"][q], 2)
            for q in ("p50", "p99")}
    run = {"label": args.label, "command": "python case_multilora/loadtest/http_path_bench.py " +
           " ".join(argv if argv is not None else sys.argv[1:]),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True).stdout.strip(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "settings": {k: v for k, v in vars(args).items() if k not in ("serve", "port", "out", "profile_gateway")},
           "cells": cells, "on_over_off": ratios}
    print(json.dumps(run["on_over_off"]), flush=True)
    if args.out:
        runs = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
        doc = {"description": __doc__.split("\n\n")[0], "runs": runs + [run]}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
