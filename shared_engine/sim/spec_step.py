"""`SimSpeculation`: speculative decoding in the capacity model, with the acceptance rate as a workload
parameter (`speculative_config.acceptance_rate`: each draft accepted with that probability given the ones
before it, the i.i.d. model of Leviathan et al. 2023). Before each step every decoding request gets k
dummy drafts (policy `always`; capped by max_tokens and max_model_len as the scheduler caps them); after it a
request with n drafts yields 1 + (accepted run) tokens, drawn from a seeded stream. The scheduler, block
manager and step-time model run unchanged: a speculative decode costs its k + 1 tokens through the same
roofline as any other token. Not modelled: the host work that async scheduling no longer hides on a
speculative step (the engine's auto policy measures it as c2)."""

from __future__ import annotations

import random

DUMMY_TOKEN_ID = 0


class SimSpeculation:
    def __init__(self, k: int, acceptance_rate: float, max_model_len: int, seed: int = 0) -> None:
        self.k = k
        self.acceptance_rate = acceptance_rate
        self.max_model_len = max_model_len
        self._rng = random.Random(seed)

    @classmethod
    def of(cls, config, max_model_len: int) -> SimSpeculation | None:
        spec = config.speculative_config
        return None if spec is None else cls(spec.num_speculative_tokens, spec.acceptance_rate, max_model_len)

    def propose(self, running: list) -> None:
        for r in running:
            outputs = r.output_token_ids
            if r.num_remaining_tokens == 1 and outputs and outputs[-1] >= 0:
                n = min(self.k, r.max_tokens - len(outputs), self.max_model_len - r.num_tokens)
                r.draft_token_ids = [DUMMY_TOKEN_ID] * max(n, 0)

    def tokens(self, num_drafts: int) -> tuple[int, ...]:
        """The step's tokens for a request that verified `num_drafts` drafts."""
        accepted = 0
        while accepted < num_drafts and self._rng.random() < self.acceptance_rate:
            accepted += 1
        return (DUMMY_TOKEN_ID,) * (accepted + 1)
