"""Speculation policies: how many draft tokens each request gets this step.

`always`: k for every request (experiments). `auto`: speculate, and how far, only where the expected
tokens per second beat plain decoding (see `AutoPolicy`).
"""

from __future__ import annotations


class AlwaysPolicy:
    def __init__(self, config) -> None:
        self.k = config.num_speculative_tokens
        self.padding = None  # how the runner pads wide speculative steps (AutoPolicy prices it; unused here)

    def max_drafts(self, num_running: int) -> int:
        return self.k

    def num_drafts(self, requests: list, num_running: int) -> list[int]:
        return [self.k] * len(requests)

    def observe_step(self, num_tokens: int, speculative: bool, seconds: float,
                     num_draft_tokens: int | None = None, num_drafting: int = 0) -> None:
        pass


def make_policy(config):
    if config.policy == "always":
        return AlwaysPolicy(config)
    from shared_engine.spec_decode.auto_policy import AutoPolicy

    return AutoPolicy(config)
