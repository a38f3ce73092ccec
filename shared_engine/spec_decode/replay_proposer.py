"""`ReplayProposer` -- BENCHMARK ONLY, never for serving: drafts the target's own greedy continuation,
recorded beforehand (`record`), each draft token right with a set probability.

Dummy weights make every real proposer's drafts worthless (nothing is accepted), so the H200 benchmarks
measure the speculative step with this stand-in instead: for draft position j of a request whose output has
n tokens, the draft is the recorded greedy token at n + j with probability `acceptance_rate` (a seeded
stream), else another token. With greedy decoding each draft is then accepted with probability
`acceptance_rate` given the drafts before it (the i.i.d. model of Leviathan et al.), and everything after a
wrong draft is rejected. Every results file made with it says so. Requests whose prompt was not recorded get
no drafts.

With dummy bf16 weights the target's own greedy tokens under the k + 1-query path drift from the recorded
ones almost at once, so the engine may also be built with `benchmark_forced_acceptance`
(`forced_acceptance.py`): then `forced_outcome` tells the rejection sampler which drafts are right and what
the recorded tokens are, and verification accepts exactly those.
"""

from __future__ import annotations

import random

from shared_engine.spec_decode.proposer import Proposer
from shared_engine.spec_decode.registry import register_proposer


@register_proposer("replay")
class ReplayProposer(Proposer):
    def __init__(self, config, seed: int = 0, **_context) -> None:
        self.acceptance_rate = config.acceptance_rate
        self.continuations: dict[tuple[int, ...], list[int]] = {}
        self._rng = random.Random(seed)
        # request id -> (drafts, right-or-wrong marks, recorded tokens at the step's positions) of the last
        # `propose`, for `forced_outcome`
        self._outcomes: dict[str, tuple[tuple[int, ...], list[bool], list[int]]] = {}

    def record(self, prompt_token_ids: list[int], continuation: list[int]) -> None:
        """The target's greedy output for this prompt (from a run with speculation off)."""
        self.continuations[tuple(prompt_token_ids)] = list(continuation)

    def reseed(self, seed: int) -> None:
        """Restart the right-or-wrong stream (each benchmark run draws the same marks)."""
        self._rng = random.Random(seed)

    def propose(self, requests: list, caps: list[int]) -> list[list[int]]:
        drafts = []
        for request, cap in zip(requests, caps):
            truth = self.continuations.get(tuple(request.prompt_token_ids))
            if truth is None:
                drafts.append([])
                continue
            start = request.num_output_tokens
            recorded = truth[start:start + max(cap, 0)]
            marks = [self._rng.random() < self.acceptance_rate for _ in recorded]
            draft = [t if right else _wrong(t) for t, right in zip(recorded, marks)]
            self._outcomes[request.request_id] = (tuple(draft), marks, truth[start:start + len(draft) + 1])
            drafts.append(draft)
        return drafts

    def forced_outcome(self, request, draft: list[int]) -> tuple[list[bool], list[int]] | None:
        """BENCHMARK ONLY (`forced_acceptance.py`): for a request verifying `draft` (a prefix of what the last
        `propose` gave it; the scheduler may cut drafts), whether each draft token is right and the recorded
        tokens at the step's len(draft) + 1 positions (fewer where the recording ends); None for a request
        this proposer did not draft."""
        entry = self._outcomes.get(request.request_id)
        if entry is None or tuple(draft) != entry[0][:len(draft)]:
            return None
        return entry[1][:len(draft)], entry[2][:len(draft) + 1]

    def release(self, request_id: str) -> None:
        self._outcomes.pop(request_id, None)


def _wrong(token: int) -> int:
    """A token id other than `token`, inside the vocabulary (token - 1, or 1 for token 0)."""
    return token - 1 if token > 0 else 1
