"""`EngineStats`: running counters and the periodic stats line (every 10 s while not idle)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger("shared_engine")

LOG_INTERVAL_S = 10.0


@dataclass
class EngineStats:
    num_prompt_tokens_total: int = 0
    num_generation_tokens_total: int = 0
    num_steps: int = 0
    step_seconds_total: float = 0.0
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    _window_prompt: int = 0
    _window_generation: int = 0
    _window_queries: int = 0
    _window_hits: int = 0
    _last_log: float = field(default_factory=time.monotonic)

    def on_step(self, out, num_sampled: int, seconds: float, scheduler, block_manager) -> None:
        self._on_prefix_counters(scheduler.prefix_cache_queries, scheduler.prefix_cache_hits)
        prompt = out.num_batched_tokens - out.num_decode_tokens
        self.num_prompt_tokens_total += prompt
        self.num_generation_tokens_total += num_sampled
        self.num_steps += 1
        self.step_seconds_total += seconds
        self._window_prompt += prompt
        self._window_generation += num_sampled
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            self._log(now, scheduler, block_manager)

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
        self._last_log = now
        self._window_prompt = self._window_generation = self._window_queries = self._window_hits = 0
