"""Turn a measured window into the results file's figures (`vllm bench serve` names, ms, plus the case's own).

- Latencies: mean / median / p90 / p95 / p99 of TTFT, TPOT, ITL, E2EL over the window's requests; TTFT also
  per request kind (rag / document). Unfinished requests count in TTFT with their lower bound.
- `system_prompt_hit_rate`: of the system prompt's cacheable tokens (full KV blocks) in every request, the
  share the server reported as prefix-cache hits (`usage.prompt_tokens_details.cached_tokens`).
- Engine figures from `/metrics` deltas over the window: prefix cache hit rate (all prompt tokens),
  prefill tokens computed per request, preemptions, and the step composition (`vllm:iteration_tokens_total`:
  how many engine steps carried how many tokens); the gauges' mean and max over the window.
"""

from __future__ import annotations

import numpy as np
from engine_client import COUNTERS, GAUGES, RequestRecord, iteration_histogram

STATS = {"mean": None, "median": 50, "p90": 90, "p95": 95, "p99": 99}


def stats_ms(name: str, values_s) -> dict:
    arr = np.asarray(list(values_s), dtype=float) * 1000.0
    out = {}
    for stat, q in STATS.items():
        value = 0.0 if not arr.size else float(arr.mean() if q is None else np.percentile(arr, q))
        out[f"{stat}_{name}_ms"] = value
    return out


def quantiles_ms(values_s, points: int = 101) -> list[float]:
    """`points` evenly spaced quantiles (0 to 100 %), for CDF plots without storing every sample."""
    arr = np.asarray(list(values_s), dtype=float) * 1000.0
    return [] if not arr.size else [round(float(v), 3) for v in np.percentile(arr, np.linspace(0, 100, points))]


def latency_summary(records: list[RequestRecord], duration_s: float) -> dict:
    ok = [r for r in records if r.ok and not r.error]
    ttft = [r.ttft_s if r.ttft_s else r.ttft_censored_s for r in records if r.ttft_s or r.ttft_censored_s]
    itl = [x for r in records for x in r.itl_s]
    tpot = [(r.e2el_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    out = {
        "num_requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "duration_s": duration_s, "request_rate_offered": len(records) / duration_s,
        "request_throughput": len(ok) / duration_s, "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "mean_prompt_tokens": in_tokens / len(ok) if ok else 0.0,
        # what the engine had to compute per request: the prompt less its prefix-cache hit (usage)
        "mean_uncached_prompt_tokens": sum(r.prompt_tokens - r.cached_tokens for r in ok) / len(ok) if ok else 0.0,
        "errors": sorted({r.error for r in records if r.error})[:10],
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", [r.e2el_s for r in ok])):
        out.update(stats_ms(name, values))
    for kind in ("rag", "document"):
        out[f"ttft_by_kind_{kind}"] = stats_ms("ttft", [r.ttft_s for r in ok if r.kind == kind])
        out[f"ttft_by_kind_{kind}"]["count"] = sum(r.kind == kind for r in ok)
    out["ttft_quantiles_ms"] = quantiles_ms(ttft)
    out["itl_quantiles_ms"] = quantiles_ms(itl)
    return out


def system_prompt_hits(records: list[RequestRecord], block_size: int) -> dict:
    ok = [r for r in records if r.ok and not r.error]
    pairs = [r.system_hit_tokens(block_size) for r in ok]
    hit, cacheable = sum(h for h, _ in pairs), sum(c for _, c in pairs)
    full = sum(1 for h, c in pairs if c and h == c)
    return {"system_prompt_hit_rate": hit / cacheable if cacheable else 0.0,
            "system_prompt_hit_tokens": hit, "system_prompt_cacheable_tokens": cacheable,
            "requests_with_full_system_prompt_hit": full, "requests_counted": len(ok),
            "prompt_tokens_cached_share": sum(r.cached_tokens for r in ok) / max(1, sum(r.prompt_tokens for r in ok))}


def engine_summary(start: dict, end: dict, series: dict, window: tuple[float, float], num_requests: int) -> dict:
    delta = {name: end.get(name, 0.0) - start.get(name, 0.0) for name in COUNTERS}
    queries, hits = delta["vllm:prefix_cache_queries_total"], delta["vllm:prefix_cache_hits_total"]
    h0, h1 = iteration_histogram(start), iteration_histogram(end)
    bounds = sorted(h1, key=lambda b: float(b))
    cumulative = [h1[b] - h0.get(b, 0.0) for b in bounds]
    per_bucket = {b: c - (cumulative[i - 1] if i else 0.0) for i, (b, c) in enumerate(zip(bounds, cumulative))}
    num_steps = cumulative[-1] if cumulative else 0.0
    tokens = delta["vllm:prompt_tokens_total"] + delta["vllm:generation_tokens_total"]
    t = np.asarray(series.get("t_s", []))
    inside = (t >= window[0]) & (t <= window[1])
    gauges = {}
    for name in GAUGES:
        values = np.asarray(series.get(name, []))[inside] if inside.any() else np.zeros(1)
        short = name.split(":", 1)[1]
        gauges[f"mean_{short}"], gauges[f"max_{short}"] = float(values.mean()), float(values.max())
    gaps = np.diff(t) if t.size > 1 else np.zeros(1)
    return {
        "max_scrape_gap_s": float(gaps.max()),  # >> the scrape interval: the client or server was starved/paused
        "counters_delta": delta,
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "prefill_tokens_computed": delta["vllm:prompt_tokens_total"],
        "prefill_tokens_computed_per_request": delta["vllm:prompt_tokens_total"] / max(1, num_requests),
        "num_preemptions": delta["vllm:num_preemptions_total"],
        "num_steps": num_steps, "mean_tokens_per_step": tokens / num_steps if num_steps else 0.0,
        "steps_by_tokens_le": per_bucket,
        **gauges,
    }


def check_targets(summary: dict, targets: dict) -> dict:
    checks = {
        "p95_ttft_ms": summary["p95_ttft_ms"] <= targets["p95_ttft_ms"],
        "p95_itl_ms": summary["p95_itl_ms"] <= targets["p95_itl_ms"],
        "system_prompt_hit_rate": summary["system_prompt_hit_rate"] >= targets["min_system_prompt_hit_rate"],
        "no_failures": summary["failed"] == 0,
    }
    return {**checks, "all": all(checks.values())}
