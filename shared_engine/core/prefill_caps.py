"""`PartialPrefillCaps`: how many requests may be mid-prefill at once, how many of those may be long, and
how large one long request's chunk may be per step (vLLM's `--max-num-partial-prefills`,
`--max-long-partial-prefills`, `--long-prefill-token-threshold`). Imports no torch.

A request is *mid-prefill* while more than one of its tokens is uncached (`num_remaining_tokens > 1`), and
*long* while more than `long_prefill_token_threshold` are. The scheduler builds one of these per step, with
the running requests that are mid-prefill, and asks it before admitting a waiting request
(`admits`), after which it `add`s the admitted one; `chunker` sizes every prefill chunk.
With `max_long_partial_prefills < max_num_partial_prefills`, a slot is always left for a short prompt, and
with the chunk cap a long prompt never takes the whole token budget: a short turn arriving during another
session's cold 60k-token prefill is scheduled at the next step instead of after the long one finishes
(vLLM V0's `PartialPrefillMetadata`; V1 keeps the chunk cap). Not set: no limits (the scheduler's behaviour
without them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from shared_engine.config.scheduler_config import SchedulerConfig


class PartialPrefillCaps:
    """One step's partial-prefill accounting. `remaining` arguments are tokens still to compute."""

    __slots__ = ("max_partial", "max_long", "threshold", "num_partial", "num_long")

    def __init__(self, config: SchedulerConfig, remaining_of_running: Iterable[int] = ()) -> None:
        self.max_partial = config.max_num_partial_prefills
        self.max_long = config.max_long_partial_prefills
        self.threshold = config.long_prefill_token_threshold
        self.num_partial = self.num_long = 0
        for remaining in remaining_of_running:
            self.add(remaining)

    @classmethod
    def for_step(cls, config: SchedulerConfig, running: Iterable) -> PartialPrefillCaps | _NoCaps:
        """This step's caps, counting the `running` requests mid-prefill (without a cap set: one that
        admits everything, counting nothing)."""
        if not (config.max_num_partial_prefills or config.max_long_partial_prefills
                or config.long_prefill_token_threshold):
            return _NO_CAPS
        return cls(config, (r.num_remaining_tokens for r in running))

    @staticmethod
    def chunker(config: SchedulerConfig) -> Callable[[int, int], int]:
        """`(remaining, budget) -> tokens this step`: a long prefill gets at most the threshold; plain `min`
        when there is no threshold."""
        threshold = config.long_prefill_token_threshold
        if not threshold:
            return min
        return lambda remaining, budget: min(remaining, budget, threshold)

    def is_long(self, remaining: int) -> bool:
        return 0 < self.threshold < remaining

    def admits(self, remaining: int) -> bool:
        """Whether a waiting request with `remaining` uncached tokens may start its prefill this step."""
        if remaining <= 1:
            return True
        if self.max_partial is not None and self.num_partial >= self.max_partial:
            return False
        return not (self.max_long is not None and self.is_long(remaining) and self.num_long >= self.max_long)

    def full_for(self, least_remaining: int) -> bool:
        """Whether no waiting request with at least `least_remaining` uncached tokens can start its prefill
        this step (`admits` is False for all of them): the partial-prefill slots are taken. Lets admission
        defer such a request without looking up its cached prefix."""
        return least_remaining > 1 and self.max_partial is not None and self.num_partial >= self.max_partial

    def add(self, remaining: int) -> None:
        if remaining <= 1:
            return
        self.num_partial += 1
        self.num_long += self.is_long(remaining)


class _NoCaps:
    @staticmethod
    def admits(remaining: int) -> bool:
        return True

    @staticmethod
    def full_for(least_remaining: int) -> bool:
        return False

    @staticmethod
    def add(remaining: int) -> None:
        pass


_NO_CAPS = _NoCaps()
