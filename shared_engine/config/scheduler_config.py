"""Continuous-batching scheduler settings."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_choice, check_range


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step limits.

    `max_num_batched_tokens` is the per-step token budget shared by decodes (1 token each) and prefill
    chunks; None means 8192 (vLLM's offline default). `max_num_seqs` caps the requests in one step.
    `enable_async_output_proc` processes step n's outputs after step n+1 is launched (vLLM V0's async
    output processing; engine/async_output.py). Off by default: on one H200 it hid the host work of the RAG
    case's 200-user load (with cascade attention: steps 31 -> 22-25 ms; case_rag_chatbot/the_fix/config.yaml
    turns it on), but it delays every output by one step; offline it changed nothing. `async_scheduling`
    also schedules and launches step n+1 before step n's sampled tokens reach the host (vLLM V1's
    `--async-scheduling`; implies async output processing; engine/async_output.py). On by default on CUDA,
    as in vLLM: llama-3.1-8b on one H200 (7d544a4) went from 117.3 s to 108.4 s on 1,000 x 1,000 and from
    5.06 to 4.79 ms per token at batch 1. Off on the CPU, where a step's launch already waits for it.

    Partial-prefill caps (vLLM's names; `core/prefill_caps.py`): `max_num_partial_prefills` requests may be
    mid-prefill at once, `max_long_partial_prefills` of them long (more than `long_prefill_token_threshold`
    uncached tokens), and a long one gets at most `long_prefill_token_threshold` tokens per step. None / 0:
    no cap (vLLM's defaults are 1, 1 and 0 with the caps used only above 1; unset here keeps this engine's
    unbounded concurrent prefills). Needs chunked prefill. With `scheduling_policy="fair"` the threshold also
    marks the running prefills that yield a step to another tenant's admission (core/scheduling/fair.py).

    `over_share_prefill_tokens` (needs `scheduling_policy="fair"` and chunked prefill; 0: off): while two or
    more tenants have requests, the prompts of more uncached tokens than this of the tenants served more than
    the least-served one (a higher VTC counter) get at most this many prefill tokens per step in all, and
    their running prefills yield to another tenant's admission as long ones do (core/share_cap.py). Set it
    near the device's compute knee (the prompt tokens a step takes before its time grows: about 128 for
    llama-3.1-8b on one H200) and above the light tenants' prompts.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    max_waiting_requests: int | None = 1024
    enable_async_output_proc: bool = False
    async_scheduling: bool | None = None  # None: on for CUDA, off for the CPU (EngineConfig.with_resolved_defaults)
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"  # fcfs | priority | fair (core/scheduling/; vLLM's --scheduling-policy)
    over_share_prefill_tokens: int = 0  # fair only: per-step prefill tokens of tenants above the least-served

    def __post_init__(self) -> None:
        check_range("max_num_seqs", self.max_num_seqs, 1, 65536)
        check_range("max_num_batched_tokens", self.max_num_batched_tokens, 1, allow_none=True)
        check_range("max_waiting_requests", self.max_waiting_requests, 0, allow_none=True)
        check_range("max_num_partial_prefills", self.max_num_partial_prefills, 1, 65536, allow_none=True)
        check_range("max_long_partial_prefills", self.max_long_partial_prefills, 1,
                    self.max_num_partial_prefills, allow_none=True)
        check_range("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if self.max_long_partial_prefills is not None and not self.long_prefill_token_threshold:
            raise ValueError("max_long_partial_prefills needs long_prefill_token_threshold >= 1, got 0")
        if not self.enable_chunked_prefill and (self.max_num_partial_prefills is not None
                                                or self.long_prefill_token_threshold):
            raise ValueError("max_num_partial_prefills and long_prefill_token_threshold need "
                             "enable_chunked_prefill=True")
        check_choice("scheduling_policy", self.scheduling_policy, {"fcfs", "priority", "fair"})
        check_range("over_share_prefill_tokens", self.over_share_prefill_tokens, 0)
        if self.over_share_prefill_tokens and (self.scheduling_policy != "fair" or not self.enable_chunked_prefill):
            raise ValueError("over_share_prefill_tokens needs scheduling_policy='fair' and enable_chunked_prefill="
                             f"True, got {self.scheduling_policy!r} and {self.enable_chunked_prefill}")

    @property
    def token_budget(self) -> int:
        """Tokens per step: `max_num_batched_tokens`, or 8192 when unset."""
        return self.max_num_batched_tokens or 8192
