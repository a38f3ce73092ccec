"""Closed-loop users against the engine's OpenAI API (asyncio + httpx streaming: little client overhead).

Each user thinks (exponential, mean `think_time_mean_s`), sends one streamed request, waits for the whole
answer, thinks again; the first request also follows one think time, so users do not start in step.
Requests that start in [warmup_s, warmup_s + duration_s) are the measured window. When the window closes,
users stop sending; requests still in flight get `drain_s` to finish, then are cancelled and recorded as
unfinished (their TTFT, if no token came, is at least the time they waited: a lower bound, kept in the
TTFT percentiles so an overloaded server cannot look good by never answering).

A scraper polls `/metrics` every `scrape_interval_s` (the gauges as a time series) and snapshots the
counters when the window opens and after the drain (deltas = the window's engine work).

With several replicas (one engine server per GPU), user u always talks to replica u mod N (session
affinity, as a gateway or a Service with `sessionAffinity: ClientIP` routes one client), and the scraper
merges the replicas' metrics (`engine_client.merge_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
from case_workload import RequestSampler
from engine_client import GAUGES, RequestRecord, scrape, stream_completion

# Idle connections are dropped before the server's keep-alive timeout (uvicorn's 5 s, as vLLM's server):
# with httpx's default of the same 5 s, a user whose think time ended just then sent its POST on a connection
# the server was closing and got ReadError (1 of 2,639 requests, 488a6ec; a POST is not retried).
KEEPALIVE_EXPIRY_S = 3.0


@dataclass
class LoadShape:
    users: int
    think_time_mean_s: float
    warmup_s: float
    duration_s: float
    drain_s: float = 60.0
    scrape_interval_s: float = 1.0
    seed: int = 0


@dataclass
class LoadResult:
    records: list[RequestRecord]  # measured window only
    metrics_start: dict
    metrics_end: dict
    timeseries: dict = field(default_factory=dict)  # {"t_s": [...], gauge: [...]}, t from the run's start
    num_unfinished: int = 0


async def _user(uid: int, shape: LoadShape, sampler: RequestSampler, client: httpx.AsyncClient, url: str,
                model: str, t0: float, records: list[RequestRecord]) -> None:
    rng = np.random.default_rng([shape.seed, 1000 + uid])
    window_end = shape.warmup_s + shape.duration_s
    while True:
        think = rng.exponential(shape.think_time_mean_s)
        if time.perf_counter() - t0 + think >= window_end:
            return  # its next request would start after the window: nothing left to measure
        await asyncio.sleep(think)
        started = time.perf_counter() - t0
        request = sampler.sample(rng)
        record = RequestRecord(request.kind, uid, started, len(request.prompt), request.max_tokens,
                               request.system_offset, request.system_tokens)
        if started >= shape.warmup_s:
            records.append(record)
        await stream_completion(client, url, model, request.prompt, request.max_tokens, record)


async def _scraper(client: httpx.AsyncClient, base_url: list[str], shape: LoadShape, t0: float, series: dict,
                   snapshots: dict, stop: asyncio.Event) -> None:
    while not stop.is_set():
        now = time.perf_counter() - t0
        try:
            metrics = await scrape(client, base_url)
        except httpx.HTTPError:
            metrics = None
        if metrics is not None:
            series["t_s"].append(round(now, 3))
            for name in GAUGES:
                series[name].append(metrics.get(name, 0.0))
            if "start" not in snapshots and now >= shape.warmup_s:
                snapshots["start"] = metrics
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=shape.scrape_interval_s)


async def idle_reference(base_url: str, model: str, sampler: RequestSampler, seed: int) -> dict:
    """One RAG request on an idle server, after one that puts the system prompt in the cache: the latency floor
    of this hardware and config (what the targets are compared with)."""
    rng = np.random.default_rng([seed, 99])
    url = base_url.rstrip("/") + "/v1/completions"
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30)) as client:
        for _ in range(2):
            request = sampler.sample(rng)
            while request.kind != "rag":
                request = sampler.sample(rng)
            record = RequestRecord("rag", -1, 0.0, len(request.prompt), request.max_tokens, request.system_offset,
                                   request.system_tokens)
            await stream_completion(client, url, model, request.prompt, request.max_tokens, record)
    return {"prompt_tokens": record.prompt_tokens, "cached_tokens": record.cached_tokens,
            "output_tokens": record.output_tokens, "ttft_ms": 1000 * record.ttft_s,
            "median_itl_ms": 1000 * float(np.median(record.itl_s)) if record.itl_s else 0.0, "error": record.error}


async def run_load(base_url: str | list[str], model: str, sampler: RequestSampler, shape: LoadShape) -> LoadResult:
    """`base_url`: one server, or a list of replicas (users spread over them, metrics merged)."""
    base_url = [u.rstrip("/") for u in ([base_url] if isinstance(base_url, str) else base_url)]
    urls = [u + "/v1/completions" for u in base_url]
    limits = httpx.Limits(max_connections=shape.users + 4, max_keepalive_connections=shape.users + 4,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    records: list[RequestRecord] = []
    series: dict = {"t_s": [], **{name: [] for name in GAUGES}}
    snapshots: dict = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30), limits=limits) as client, \
            httpx.AsyncClient(timeout=30) as metrics_client:
        t0 = time.perf_counter()
        stop = asyncio.Event()
        scraper = asyncio.create_task(_scraper(metrics_client, base_url, shape, t0, series, snapshots, stop))
        users = [asyncio.create_task(_user(u, shape, sampler, client, urls[u % len(urls)], model, t0, records))
                 for u in range(shape.users)]
        await asyncio.sleep(shape.warmup_s + shape.duration_s)
        _, pending = await asyncio.wait(users, timeout=shape.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        unfinished = 0
        now = time.perf_counter() - t0
        for record in records:
            if record.e2el_s == 0.0 and not record.error:
                unfinished += 1
                record.error = "unfinished at the end of the drain"
                if record.ttft_s == 0.0:
                    record.ttft_censored_s = now - record.start_s
        stop.set()
        await scraper
        snapshots.setdefault("start", snapshots.get("start") or await scrape(metrics_client, base_url))
        end = await scrape(metrics_client, base_url)
    return LoadResult(records, snapshots["start"], end, series, unfinished)
