"""`SpecDecoder`: before each step, asks the policy how far to speculate and the proposer for drafts, and
leaves them on the requests (`Request.draft_token_ids`) for the scheduler."""

from __future__ import annotations

from shared_engine.spec_decode.policy import make_policy
from shared_engine.spec_decode.registry import build_proposer


class SpecDecoder:
    def __init__(self, config, max_model_len: int, **context) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.proposer = build_proposer(config, **context)
        self.policy = make_policy(config)

    @property
    def draft_probs(self):
        return self.proposer.draft_probs

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes per KV block the proposer adds to the target's (a draft model's cache; else 0)."""
        return self.proposer.kv_bytes_per_block

    @property
    def reserved_kv_bytes(self) -> int:
        return self.proposer.reserved_kv_bytes

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.proposer.allocate_kv_cache(num_blocks)

    def bind(self, block_manager) -> None:
        self.proposer.bind(block_manager)

    def set_step_padding(self, padding: tuple[int, int, int] | None) -> None:
        """How the model runner runs speculative steps (`CudaGraphRunner.spec_step_padding`), for the policy's
        prices (auto_policy.py: decode rows, mixed graphs, padded varlen graphs)."""
        self.policy.padding = padding

    def wants_drafts(self, num_running: int) -> bool:
        """Whether the next step may speculate (the async stepper then resolves the step in flight first)."""
        return self.policy.max_drafts(num_running) > 0

    def propose(self, running: list) -> None:
        """Set the drafts of every running request whose last token is known and that decodes next."""
        eligible = [r for r in running
                    if r.num_remaining_tokens == 1 and r.output_token_ids and r.output_token_ids[-1] >= 0]
        if not eligible:
            return
        ks = self.policy.num_drafts(eligible, len(running))
        caps = [min(k, r.max_tokens - r.num_output_tokens, self.max_model_len - r.num_tokens)
                for r, k in zip(eligible, ks)]
        drafting = [(r, cap) for r, cap in zip(eligible, caps) if cap > 0]  # the proposer's work for these only
        if drafting:
            requests, caps = map(list, zip(*drafting))
            for request, drafts in zip(requests, self.proposer.propose(requests, caps)):
                request.draft_token_ids = drafts

    def on_step(self, out, seconds: float) -> None:
        """A step's (`SchedulerOutput`) measured cost, for the policy's step-time model."""
        drafting = sum(1 for item in out.scheduled if item.num_draft_tokens) if out.has_drafts else 0
        self.policy.observe_step(out.num_batched_tokens, out.has_drafts, seconds, out.num_draft_tokens, drafting)

    def on_finished(self, request) -> None:
        self.proposer.on_finished(request)

    def release(self, request_id: str) -> None:
        self.proposer.release(request_id)
