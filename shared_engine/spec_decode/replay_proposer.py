"""`ReplayProposer` -- BENCHMARK ONLY, never for serving: drafts the target's own greedy continuation,
recorded beforehand (`record`), each draft token right with a set probability.

Dummy weights make every real proposer's drafts worthless (nothing is accepted), so the H200 benchmarks
measure the speculative step with this stand-in instead: for draft position j of a request whose output has
n tokens, the draft is the recorded greedy token at n + j with probability `acceptance_rate`, else another
token. With greedy decoding each draft is then accepted with probability `acceptance_rate` given the drafts
before it (the i.i.d. model of Leviathan et al.), and everything after a wrong draft is rejected. Every
results file made with it says so. Requests whose prompt was not recorded get no drafts.
"""

from __future__ import annotations

import random

from shared_engine.spec_decode.proposer import Proposer
from shared_engine.spec_decode.registry import register_proposer


@register_proposer("replay")
class ReplayProposer(Proposer):
    def __init__(self, config, **_context) -> None:
        self.acceptance_rate = config.acceptance_rate
        self.continuations: dict[tuple[int, ...], list[int]] = {}
        self._rng = random.Random(0)

    def record(self, prompt_token_ids: list[int], continuation: list[int]) -> None:
        """The target's greedy output for this prompt (from a run with speculation off)."""
        self.continuations[tuple(prompt_token_ids)] = list(continuation)

    def propose(self, requests: list, caps: list[int]) -> list[list[int]]:
        drafts = []
        for request, cap in zip(requests, caps):
            truth = self.continuations.get(tuple(request.prompt_token_ids), [])
            start = request.num_output_tokens
            draft = []
            for token in truth[start:start + max(cap, 0)]:
                draft.append(token if self._rng.random() < self.acceptance_rate else token + 1)
            drafts.append(draft)
        return drafts
