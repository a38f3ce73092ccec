"""`Proposer`: guesses a request's next tokens from what it has generated so far."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Proposer(ABC):
    """Drafts for running requests. `propose` gets the requests that may speculate this step (their last
    token known, one token left to compute) with each one's draft length cap, and returns each request's
    drafts (possibly empty, never longer than its cap). Host-only proposers (n-gram, suffix) return
    one-hot drafts: `draft_probs` stays None."""

    # [num_draft_rows, vocab] probabilities of the last `propose`'s drafts (a draft model), or None (one-hot)
    draft_probs = None

    @abstractmethod
    def propose(self, requests: list, caps: list[int]) -> list[list[int]]: ...

    def on_finished(self, request) -> None:
        """A request ended: proposers that learn from finished outputs (suffix trees) may keep them."""
        return None

    def release(self, request_id: str) -> None:
        """Forget per-request state."""
        return None
