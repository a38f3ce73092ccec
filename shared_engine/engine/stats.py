"""`EngineStats`: running counters and the periodic stats line (every 10 s while not idle)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from shared_engine.engine.spec_stats import SpecDecodeStats

logger = logging.getLogger("shared_engine")

LOG_INTERVAL_S = 10.0


@dataclass
class EngineStats:
    num_prompt_tokens_total: int = 0
    num_generation_tokens_total: int = 0
    num_steps: int = 0
    step_seconds_total: float = 0.0
    # seconds since start: [scheduling, model runner, output processing, GPU span (CUDA; 0 on CPU)]
    phase_seconds_total: list[float] = field(default_factory=lambda: [0.0] * 4)
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    spec: SpecDecodeStats | None = None  # speculative decoding's counters, when it is on
    # the batch each step actually ran at: sequences in the step (decodes and prefill chunks) and, over the
    # steps with at least one decode, the decode rows (speculative decodes count once); the maxima are since
    # start or since `reset_batch_maxima` (a benchmark resets them before its timed run, totals are deltas)
    scheduled_seqs_total: int = 0
    scheduled_seqs_max: int = 0
    decode_steps: int = 0
    decode_seqs_total: int = 0
    decode_seqs_max: int = 0
    _window_prompt: int = 0
    _window_generation: int = 0
    _window_queries: int = 0
    _window_hits: int = 0
    # KV offload's host tier (scheduler.host_prefix_cache_*): totals at the last step, and this window's
    _host_totals: tuple[int, int] = (0, 0)
    _window_host: list[int] = field(default_factory=lambda: [0, 0])
    _window_steps: int = 0
    # seconds in the window: [whole steps, scheduling, model runner, output processing, GPU span (CUDA)]
    _window_phases: list[float] = field(default_factory=lambda: [0.0] * 5)
    _last_log: float = field(default_factory=time.monotonic)

    def on_step(self, out, num_sampled: int, seconds: float, scheduler, block_manager,
                phases: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)) -> None:
        """`num_sampled`: tokens the step added to outputs (a speculative decode adds up to k + 1; tokens
        past a stop are not counted). `phases`: seconds of this step spent scheduling, in the model runner,
        processing outputs, and the runner's GPU span (first kernel to sampled ids; 0 on CPU)."""
        self._on_prefix_counters(scheduler.prefix_cache_queries, scheduler.prefix_cache_hits)
        host = (scheduler.host_prefix_cache_queries, scheduler.host_prefix_cache_hits)
        if host != self._host_totals:
            self._window_host[0] += host[0] - self._host_totals[0]
            self._window_host[1] += host[1] - self._host_totals[1]
            self._host_totals = host
        decode_tokens = out.num_decode_tokens  # one pass over the step's requests
        prompt = out.num_batched_tokens - decode_tokens
        self.num_prompt_tokens_total += prompt
        # decode rows: each plain decode is 1 token, each speculative one its drafts + 1
        self._on_batch(len(out.scheduled), decode_tokens - out.num_draft_tokens)
        self.num_generation_tokens_total += num_sampled
        self.num_steps += 1
        self.step_seconds_total += seconds
        self._window_prompt += prompt
        self._window_generation += num_sampled
        self._window_steps += 1
        for i, value in enumerate((seconds, *phases)):
            self._window_phases[i] += value
        for i, value in enumerate(phases):
            self.phase_seconds_total[i] += value
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            self._log(now, scheduler, block_manager)

    def _on_batch(self, seqs: int, decodes: int) -> None:
        self.scheduled_seqs_total += seqs
        self.scheduled_seqs_max = max(self.scheduled_seqs_max, seqs)
        if decodes:
            self.decode_steps += 1
            self.decode_seqs_total += decodes
            self.decode_seqs_max = max(self.decode_seqs_max, decodes)

    def reset_batch_maxima(self) -> None:
        self.scheduled_seqs_max = self.decode_seqs_max = 0

    def _on_prefix_counters(self, queries_total: int, hits_total: int) -> None:
        self._window_queries += queries_total - self.prefix_cache_queries_total
        self._window_hits += hits_total - self.prefix_cache_hits_total
        self.prefix_cache_queries_total, self.prefix_cache_hits_total = queries_total, hits_total

    def _log(self, now: float, scheduler, block_manager) -> None:
        elapsed = now - self._last_log
        hit_rate = 100.0 * self._window_hits / self._window_queries if self._window_queries else 0.0
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
            "Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
            self._window_prompt / elapsed, self._window_generation / elapsed, scheduler.num_running,
            scheduler.num_waiting, 100.0 * block_manager.usage, hit_rate,
        )
        if block_manager.host is not None:  # vLLM's wording for a KV connector's hits
            queries, hits = self._window_host
            logger.info("External prefix cache hit rate: %.1f%% (KV offload: %d of %d host-tier blocks in use)",
                        100.0 * hits / queries if queries else 0.0, len(block_manager.host),
                        block_manager.host.num_blocks)
        self._window_host = [0, 0]
        spec = self.spec.log_fields() if self.spec is not None else None
        if spec is not None:
            logger.info("SpecDecoding metrics: Draft acceptance rate: %.1f%%, Mean acceptance length: %.2f, "
                        "Speculative steps: %.1f%%", 100.0 * spec[0], spec[1], 100.0 * spec[2])
        if self._window_steps:
            ms = [1e3 * v / self._window_steps for v in self._window_phases]
            gaps = 1e3 * max(0.0, elapsed - self._window_phases[0]) / self._window_steps
            logger.info(
                "Step time: %d steps, mean %.1f ms (schedule %.1f, model %.1f [GPU span %.1f], outputs %.1f), "
                "%.1f ms between steps", self._window_steps, ms[0], ms[1], ms[2], ms[4], ms[3], gaps,
            )
        self._last_log = now
        self._window_steps = 0
        self._window_phases = [0.0] * 5
        self._window_prompt = self._window_generation = self._window_queries = self._window_hits = 0
