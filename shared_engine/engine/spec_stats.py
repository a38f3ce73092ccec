"""`SpecDecodeStats`: speculative decoding counters (vLLM's `vllm:spec_decode_*`, in tokens, never steps) and
the window behind the 10-second log line's acceptance figures."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_drafts_total: int = 0  # speculative decodes verified (requests x steps with >= 1 draft token)
    num_draft_tokens_total: int = 0
    num_accepted_tokens_total: int = 0
    accepted_per_pos_total: list[int] = field(default_factory=list)  # [k]: drafts accepted at position j
    _window: list[int] = field(default_factory=lambda: [0, 0, 0, 0, 0])  # drafts, tokens, accepted, spec steps, steps

    def on_step(self, out, sampled: dict[str, list]) -> None:
        """Count the step's verified drafts: a request with n drafts whose step yielded m tokens accepted m - 1
        of them (before any stop cut the run, as vLLM counts)."""
        drafts = tokens = accepted = 0
        per_pos = self.accepted_per_pos_total
        for item in out.scheduled:
            n = item.num_draft_tokens
            result = sampled.get(item.request.request_id) if n else None
            if result is None:
                continue
            m = len(result) - 1
            drafts += 1
            tokens += n
            accepted += m
            if len(per_pos) < n:
                per_pos.extend([0] * (n - len(per_pos)))
            for j in range(m):
                per_pos[j] += 1
        self.num_drafts_total += drafts
        self.num_draft_tokens_total += tokens
        self.num_accepted_tokens_total += accepted
        w = self._window
        w[0] += drafts
        w[1] += tokens
        w[2] += accepted
        w[3] += drafts > 0
        w[4] += 1

    def log_fields(self) -> tuple[float, float, float] | None:
        """(acceptance rate, mean acceptance length, share of steps that speculated) over the window, then
        reset; None when no step ran."""
        drafts, tokens, accepted, spec_steps, steps = self._window
        self._window = [0, 0, 0, 0, 0]
        if not steps:
            return None
        rate = accepted / tokens if tokens else 0.0
        mean_len = 1.0 + accepted / drafts if drafts else 1.0
        return rate, mean_len, spec_steps / steps
