"""Prometheus metrics at `/metrics`, with vLLM's names, types, buckets and the `model_name` label
(conventions.md), so that existing dashboards and autoscalers (KEDA on `vllm:num_requests_waiting`) work
unchanged.

Engine counters are read from the engine's `EngineSnapshot` at scrape time (the same numbers as the
10-second stats line, not a second count); per-request histograms are observed by the server when a
request finishes; `vllm:iteration_tokens_total` after every engine step.
"""

from __future__ import annotations

import time

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from shared_engine.outputs import RequestOutput

TTFT_BUCKETS = [.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160,
                640, 2560]
TOKEN_LATENCY_BUCKETS = [.01, .025, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
REQUEST_LATENCY_BUCKETS = [.3, .5, .8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960,
                           1920, 7680]
ITERATION_TOKEN_BUCKETS = [2**i for i in range(15)]  # 1 .. 16384

prometheus_client.disable_created_metrics()


class _EngineCollector:
    """Gauges and counters read from the engine at scrape time."""

    def __init__(self, async_engine, model_name: str) -> None:
        self.async_engine = async_engine
        self.model_name = model_name

    def collect(self):
        snap = self.async_engine.snapshot()
        gauges = {
            "vllm:num_requests_running": ("Requests in model execution batches.", snap.num_running),
            "vllm:num_requests_waiting": ("Requests waiting to be processed.", self.async_engine.num_waiting),
            "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage.", snap.kv_cache_usage),
        }
        for name, (doc, value) in gauges.items():
            yield self._one(GaugeMetricFamily(name, doc, labels=["model_name"]), value)
        counters = {
            "vllm:prompt_tokens": ("Prefill tokens processed.", snap.prompt_tokens_total),
            "vllm:generation_tokens": ("Generation tokens processed.", snap.generation_tokens_total),
            "vllm:num_preemptions": ("Cumulative number of preemptions.", snap.num_preemptions_total),
            "vllm:prefix_cache_queries": ("Prefix cache queries, in tokens.", snap.prefix_cache_queries_total),
            "vllm:prefix_cache_hits": ("Prefix cache hits, in tokens.", snap.prefix_cache_hits_total),
            "vllm:spec_decode_num_draft_tokens": ("Draft tokens proposed.", snap.spec_decode_num_draft_tokens_total),
            "vllm:spec_decode_num_accepted_tokens": ("Draft tokens accepted.",
                                                     snap.spec_decode_num_accepted_tokens_total),
        }
        counters["vllm:external_prefix_cache_queries"] = (
            "KV offload: tokens looked up in the host tier (prefix-cache misses on the GPU).",
            snap.external_prefix_cache_queries_total)
        counters["vllm:external_prefix_cache_hits"] = ("KV offload: of those, tokens restored from the host tier.",
                                                       snap.external_prefix_cache_hits_total)
        counters["vllm:spec_decode_num_drafts"] = ("Speculative decodes verified (requests x steps).",
                                                   snap.spec_decode_num_drafts_total)
        for name, (doc, value) in counters.items():
            yield self._one(CounterMetricFamily(name, doc, labels=["model_name"]), value)
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted draft tokens by draft position.", labels=["model_name", "position"])
        for position, value in enumerate(snap.spec_decode_num_accepted_tokens_per_pos_total):
            per_pos.add_metric([self.model_name, str(position)], value)
        yield per_pos
        blocks = CounterMetricFamily("vllm:kv_offload_blocks", "KV offload: blocks copied, by direction.",
                                     labels=["model_name", "transfer_type"])
        blocks.add_metric([self.model_name, "GPU_to_CPU"], snap.kv_offload_num_offloaded_blocks_total)
        blocks.add_metric([self.model_name, "CPU_to_GPU"], snap.kv_offload_num_restored_blocks_total)
        yield blocks
        if snap.max_loras:
            yield self._lora_info(snap)

    def _lora_info(self, snap):
        """vLLM's `vllm:lora_requests_info` (value: the time of the reading) plus which adapters hold GPU slots."""
        family = GaugeMetricFamily("vllm:lora_requests_info", "Running, waiting and GPU-resident LoRA adapters.",
                                   labels=["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters",
                                           "resident_lora_adapters"])
        family.add_metric([self.model_name, str(snap.max_loras), ",".join(snap.running_lora_adapters),
                           ",".join(snap.waiting_lora_adapters), ",".join(snap.resident_lora_adapters)], time.time())
        return family

    def _one(self, family, value):
        family.add_metric([self.model_name], value)
        return family


class ServerMetrics:
    def __init__(self, async_engine, model_name: str) -> None:
        self.model_name = model_name
        self.async_engine = async_engine
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(async_engine, model_name))
        self._success = Counter("vllm:request_success", "Count of finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=self.registry)

        def hist(name: str, doc: str, buckets: list[float]):
            family = Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry)
            return family.labels(model_name)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.",
                        TOKEN_LATENCY_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", "Time per output token in seconds.",
                         TOKEN_LATENCY_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                        REQUEST_LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Time spent waiting in the queue.",
                          REQUEST_LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Time spent in prefill.",
                            REQUEST_LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Time spent in decode.",
                           REQUEST_LATENCY_BUCKETS)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Tokens per engine step.",
                                     ITERATION_TOKEN_BUCKETS)

    def on_step(self, num_tokens: int) -> None:
        """Called after every engine step with the tokens it processed (prefill + generated)."""
        if num_tokens > 0:
            self.iteration_tokens.observe(num_tokens)

    def tracker(self) -> RequestTracker:
        return RequestTracker(self)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


class RequestTracker:
    """Per-request latency bookkeeping: feed it every `RequestOutput`, then `finish()` once."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.last: RequestOutput | None = None
        self._last_token_time: float | None = None
        self._done = False

    def on_output(self, output: RequestOutput) -> None:
        t = output.metrics.last_token_time
        if self._last_token_time is not None and t is not None and t > self._last_token_time:
            self.metrics.itl.observe(t - self._last_token_time)
        self._last_token_time = t
        self.last = output

    def finish(self, aborted: bool = False) -> None:
        if self._done:
            return
        self._done = True
        m, out = self.metrics, self.last
        if aborted or out is None or not out.finished:
            m._success.labels(m.model_name, "abort").inc()
            return
        for choice in out.outputs:
            m._success.labels(m.model_name, choice.finish_reason or "abort").inc()
        t = out.metrics
        if t.first_token_time is not None:
            m.ttft.observe(t.first_token_time - t.arrival_time)
        if t.finished_time:
            m.e2e.observe(t.finished_time - t.arrival_time)
        if t.first_scheduled_time is not None:
            m.queue.observe(max(0.0, t.first_scheduled_time - t.arrival_time))
            if t.first_token_time is not None:
                m.prefill.observe(max(0.0, t.first_token_time - t.first_scheduled_time))
        if t.first_token_time is not None and t.last_token_time is not None:
            m.decode.observe(t.last_token_time - t.first_token_time)
            num_tokens = max(len(c.token_ids) for c in out.outputs)
            if num_tokens > 1:
                m.tpot.observe((t.last_token_time - t.first_token_time) / (num_tokens - 1))
