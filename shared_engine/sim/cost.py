"""Cost arithmetic on a simulated run: $ per 1M tokens, break-even against an API, fewest replicas for an SLO.

    $ per 1M tokens  = GPU $/hour * GPUs * run hours / (tokens / 1e6)
                       (you pay for the fleet the whole run, busy or idle: utilisation is the dominant term)
    API $ for a run  = input tokens / 1e6 * API input price + output tokens / 1e6 * API output price
    break-even rate  = GPUs * $/hour / 3600 / (API $ per request)      [requests per second]
                       (above it the fleet is cheaper, provided it still meets the SLO at that rate:
                       check with `fewest_replicas`; the fleet's cost does not depend on its load)

Prices are dated inputs (`HardwareProfile.price_*`, the workload's `prices`), never constants here.
"""

from __future__ import annotations

from collections.abc import Callable


def fleet_cost_usd(price_usd_per_hour: float, num_gpus: int, duration_s: float) -> float:
    return price_usd_per_hour * num_gpus * duration_s / 3600.0


def usd_per_million_tokens(price_usd_per_hour: float, num_gpus: int, duration_s: float, tokens: int) -> float:
    """Fleet cost over the run divided by millions of tokens served (inf when nothing was served)."""
    if tokens <= 0:
        return float("inf") if duration_s > 0 else 0.0
    return fleet_cost_usd(price_usd_per_hour, num_gpus, duration_s) / (tokens / 1e6)


def api_cost_usd(input_tokens: int, output_tokens: int, input_usd_per_1m: float, output_usd_per_1m: float) -> float:
    return input_tokens / 1e6 * input_usd_per_1m + output_tokens / 1e6 * output_usd_per_1m


def cost_summary(summary: dict, price_usd_per_hour: float | None, num_gpus: int, prices=None) -> dict:
    """Cost figures for a run summary (`SimMetrics.summary()`); API comparison when `prices` has both
    API prices. Missing GPU price: every $ figure is None (prices are inputs, never guessed)."""
    n_in, n_out = summary["total_input_tokens"], summary["total_output_tokens"]
    duration, completed = summary["duration_s"], summary["completed"]
    out = {"gpu_usd_per_hour": price_usd_per_hour, "num_gpus": num_gpus}
    if price_usd_per_hour is None:
        return out | {"fleet_usd": None, "usd_per_1m_output_tokens": None, "usd_per_1m_total_tokens": None}
    fleet = fleet_cost_usd(price_usd_per_hour, num_gpus, duration)
    out |= {
        "fleet_usd": fleet,
        "usd_per_1m_output_tokens": usd_per_million_tokens(price_usd_per_hour, num_gpus, duration, n_out),
        "usd_per_1m_total_tokens": usd_per_million_tokens(price_usd_per_hour, num_gpus, duration, n_in + n_out),
    }
    if prices is None or prices.api_input_usd_per_1m is None or prices.api_output_usd_per_1m is None:
        return out
    api = api_cost_usd(n_in, n_out, prices.api_input_usd_per_1m, prices.api_output_usd_per_1m)
    out |= {"api_usd": api, "api_prices_date": prices.date, "api_prices_source": prices.source,
            "self_hosted_over_api": fleet / api if api else None}
    if completed and api:
        api_per_request = api / completed
        out["break_even_request_rate"] = price_usd_per_hour * num_gpus / 3600.0 / api_per_request
        out["break_even_traffic_share"] = fleet / api  # of the simulated traffic; > 1: the API is cheaper
    return out


def meets_slo(summary: dict, slo: dict) -> bool:
    """Every SLO key (`p99_ttft_ms`, ...) at or under its limit."""
    return all(summary[key] <= limit for key, limit in slo.items())


def fewest_replicas(simulate: Callable[[int], dict], slo: dict, max_replicas: int = 256,
                    start: int = 1) -> tuple[int, dict] | None:
    """Smallest replica count whose summary meets `slo`: doubling from `start` until one passes, then
    bisection (more replicas never make latency worse: tests check it). `simulate(n)` returns a summary,
    or None for a count known to miss the SLO (a probe stopped early). None if `max_replicas` fails."""
    cache: dict[int, dict | None] = {}

    def ok(n: int) -> bool:
        if n not in cache:
            cache[n] = simulate(n)
        return cache[n] is not None and meets_slo(cache[n], slo)

    high, low = max(1, min(start, max_replicas)), 0  # low: the largest count known to fail (0: none)
    while not ok(high):
        if high >= max_replicas:
            return None
        low, high = high, min(high * 2, max_replicas)
    while high - low > 1:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid
    return high, cache[high]
