"""`scrape`: one replica's Prometheus counters (vLLM's names), summed over their labels.

Counters read: `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` (tokens),
`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:num_preemptions_total`,
`vllm:spec_decode_num_draft_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total`.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
            "vllm:generation_tokens", "vllm:num_preemptions", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")


def scrape(base_url: str, timeout_s: float = 30.0) -> dict[str, float]:
    """{counter name without `_total`: value} for `COUNTERS` (0 where absent). Raises httpx.HTTPError."""
    response = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    response.raise_for_status()
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(response.text):
        if family.name in out:
            out[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    queries = d["vllm:prefix_cache_queries"]
    d["prefix_cache_hit_rate"] = round(d["vllm:prefix_cache_hits"] / queries, 4) if queries else None
    return d
