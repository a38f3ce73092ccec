"""`GatewayMetrics`: per-tenant usage in Prometheus (label `tenant`; the engine's own metrics carry
`model_name`). Histogram buckets are vLLM's for the same quantities (conventions.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TTFT_BUCKETS = (.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560)
E2E_BUCKETS = (.3, .5, .8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("gateway_requests", "Requests answered, by tenant and HTTP status",
                                ["tenant", "status"], registry=r)
        self.rate_limited = Counter("gateway_rate_limited", "Requests refused with 429, by the limit hit",
                                    ["tenant", "limit"], registry=r)
        self.prompt_tokens = Counter("gateway_prompt_tokens", "Prompt tokens (engine usage)", ["tenant"], registry=r)
        self.cached_tokens = Counter("gateway_cached_prompt_tokens", "Prompt tokens served from the prefix cache",
                                     ["tenant"], registry=r)
        self.generation_tokens = Counter("gateway_generation_tokens", "Generated tokens (engine usage)", ["tenant"],
                                         registry=r)
        self.in_flight = Gauge("gateway_requests_in_flight", "Requests admitted and not yet finished",
                               ["tenant"], registry=r)
        self.ttft = Histogram("gateway_time_to_first_token_seconds", "Arrival at the gateway to the first token",
                              ["tenant"], buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("gateway_e2e_request_latency_seconds", "Arrival to the last byte", ["tenant"],
                             buckets=E2E_BUCKETS, registry=r)

    def usage(self, tenant: str, usage: dict | None) -> None:
        if not usage:
            return
        self.prompt_tokens.labels(tenant).inc(usage.get("prompt_tokens") or 0)
        self.generation_tokens.labels(tenant).inc(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        self.cached_tokens.labels(tenant).inc(details.get("cached_tokens") or 0)
