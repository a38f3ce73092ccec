"""Talking to the engine: one streamed request (client-side TTFT and ITL), and `/metrics` scrapes.

TTFT is the time from sending the request to the first streamed chunk with a choice, ITL the gaps between
later chunks (each carries one token: the server sends a delta per token that has text), TPOT
(E2E - TTFT) / (output tokens - 1), as `vllm bench serve` defines them. `cached_tokens` is the server's
`usage.prompt_tokens_details.cached_tokens` (prefix-cache hits of this request).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestRecord:
    kind: str
    user: int
    start_s: float  # seconds since the run started
    prompt_tokens: int
    max_tokens: int
    system_offset: int
    system_tokens: int
    ttft_s: float = 0.0
    e2el_s: float = 0.0
    output_tokens: int = 0
    cached_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""
    ttft_censored_s: float = 0.0  # unfinished without a first token: it waited at least this long

    @property
    def ok(self) -> bool:
        return not self.error and self.ttft_s > 0.0

    def system_hit_tokens(self, block_size: int) -> tuple[int, int]:
        """(system-prompt tokens served from the prefix cache, system-prompt tokens that could be).

        Only full KV blocks are cached, so the system prompt's cacheable part ends at the last block boundary
        inside it; the cache serves a prefix [0, cached_tokens) of the prompt."""
        start, end = self.system_offset, self.system_offset + self.system_tokens
        cacheable = max(0, (end // block_size) * block_size - start)
        hit = max(0, min(self.cached_tokens, start + cacheable) - start)
        return hit, cacheable


async def stream_completion(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int,
                            record: RequestRecord) -> RequestRecord:
    """POST a streamed token-id completion (`ignore_eos`: exactly `max_tokens` tokens) and fill `record`."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    record.error = str(chunk["error"].get("message"))
                    return record
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    record.output_tokens = usage["completion_tokens"]
                    record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if record.ttft_s == 0.0:
                        record.ttft_s = now - start
                    else:
                        record.itl_s.append(now - last)
                    last = now
        record.e2el_s = time.perf_counter() - start
    except httpx.HTTPError as e:
        record.error = repr(e)
    return record


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|[+-]Inf)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {"name{labels}": value}, with the `model_name` label dropped (one model)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        labels = re.sub(r'model_name="[^"]*",?', "", labels or "").replace("{}", "")
        out[name + labels] = float(value)
    return out


GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total")
ITERATION_BUCKETS = "vllm:iteration_tokens_total_bucket"


async def scrape(client: httpx.AsyncClient, base_urls: str | list[str]) -> dict[str, float]:
    """`/metrics` of one server, or of several replicas merged (`merge_metrics`)."""
    urls = [base_urls] if isinstance(base_urls, str) else base_urls
    merged = []
    for url in urls:
        response = await client.get(url + "/metrics", timeout=30)
        response.raise_for_status()
        merged.append(parse_metrics(response.text))
    return merge_metrics(merged)


def merge_metrics(replicas: list[dict[str, float]]) -> dict[str, float]:
    """Replicas' samples as one deployment's: counters, histogram buckets and request gauges add up; a
    `_perc` gauge (KV cache usage) takes the fullest replica, the one that preempts first."""
    out: dict[str, float] = {}
    for metrics in replicas:
        for key, value in metrics.items():
            if key not in out:
                out[key] = value
            elif "_perc" in key:
                out[key] = max(out[key], value)
            else:
                out[key] += value
    return out


def iteration_histogram(metrics: dict[str, float]) -> dict[str, float]:
    """Cumulative step counts by `le` bound of `vllm:iteration_tokens_total` (tokens per engine step)."""
    out = {}
    for key, value in metrics.items():
        if key.startswith(ITERATION_BUCKETS):
            out[re.search(r'le="([^"]+)"', key).group(1)] = value
    return out
