"""`SloWatch`: ends an SLO-search probe as soon as its SLO is certainly missed.

The replica search (`cost.fewest_replicas`) only reports the summary of the count that meets the SLO, so a
probe that fails needs no summary: it may stop once the outcome is decided. A percentile limit such as
`p99_ttft_ms <= 800` is decided as soon as enough finished requests exceed it:

    numpy's (linear) q-th percentile of n values is at least the sorted value at index j = floor(q/100 (n-1)),
    so it exceeds the limit once n - j values do. n - j never decreases as n grows, and n is at most N, the
    probe's request count: N - floor(q (N-1) / 100) violations decide it, one more in case numpy's float
    index rounds down.

Each replica counts its own requests (the replicas of a probe run apart), which only makes it stop later.
Watched: the `median`/`p90`/`p95`/`p99` of `ttft`, `tpot` and `e2el`, each computed from the finished
request exactly as `SimMetrics.summary` computes it; other SLO keys (means, ITL) never stop a probe.
"""

from __future__ import annotations

from shared_engine.sim.metrics import PERCENTILES

_MARGIN = 1.0 + 1e-9  # a violation counts only this far over the limit: immune to interpolation rounding


def _ttft(request) -> float | None:
    return request.first_token_time - request.arrival_time


def _e2el(request) -> float | None:
    return request.finished_time - request.arrival_time


def _tpot(request) -> float | None:  # as in the summary: requests with one output token have none
    n_out = request.num_output_tokens
    if n_out <= 1:
        return None
    return (_e2el(request) - _ttft(request)) / (n_out - 1)


_METRICS = {"ttft": _ttft, "tpot": _tpot, "e2el": _e2el}


class SloWatch:
    """Counts finished requests over each watched SLO limit; `missed(request)` is True once one of the
    percentiles is certain to exceed its limit, whatever the requests still to finish do."""

    def __init__(self, slo: dict, max_requests: int) -> None:
        self._watched = []  # [metric, limit_ms, violations needed, violations so far]
        for key, limit in slo.items():
            stat, _, rest = key.partition("_")
            metric = rest.removesuffix("_ms")
            q = PERCENTILES.get(stat)
            if q is None or metric not in _METRICS or not rest.endswith("_ms"):
                continue
            needed = max_requests - q * (max_requests - 1) // 100 + 1
            self._watched.append([_METRICS[metric], float(limit), needed, 0])

    @property
    def active(self) -> bool:
        return bool(self._watched)

    def missed(self, request) -> bool:
        """Count a finished request; True when the SLO is now certainly missed."""
        for watched in self._watched:
            value = watched[0](request)
            if value is not None and 1000.0 * value > watched[1] * _MARGIN:
                watched[3] += 1
                if watched[3] >= watched[2]:
                    return True
        return False
