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
    # a draft model's KV cache (`draft_model`): bytes per block beside the target's, and bytes it holds
    # outside the pool (scratch blocks); 0 for host-only proposers
    kv_bytes_per_block = 0
    reserved_kv_bytes = 0

    @abstractmethod
    def propose(self, requests: list, caps: list[int]) -> list[list[int]]: ...

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """A draft model's KV pool, with the target's `num_blocks` (the same block ids)."""
        return None

    def bind(self, block_manager) -> None:
        """The engine's block manager (its block tables are the draft model's too)."""
        return None

    def on_finished(self, request) -> None:
        """A request ended: proposers that learn from finished outputs (suffix trees) may keep them."""
        return None

    def release(self, request_id: str) -> None:
        """Forget per-request state."""
        return None
