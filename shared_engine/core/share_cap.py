"""`OverShareCap`: one step's prefill-token allowance for the large prompts of tenants served more than the
least-served one (`over_share_prefill_tokens` with `scheduling_policy="fair"`). Imports no torch.

A tenant is *over its share* in a step when its virtual token counter (core/scheduling/fair.py) is above the
lowest counter among the tenants with requests in the scheduler, as the counters stand before the step is
charged. A prompt is *large* when more of its tokens than the cap missed the prefix cache. While at least two
tenants have requests, the large prompts of over-share tenants get at most `over_share_prefill_tokens`
prefill tokens per step in all (running chunks and first chunks at admission together). Not capped: the
least-served tenant (and any tied with it), prompts within the cap (a light tenant's question, whatever its
counter: under the VTC lift, returning tenants sit at or just above the busiest one, so the counter alone
does not tell a whale from a busy small tenant), decodes, and a tenant alone.

Admission goes first: a waiting large over-share prompt takes its whole first chunk if it fits in what is
left of the cap, or the whole cap if no one took any of it and no large over-share prefill is running, else
it waits (so such prompts go through one at a time instead of all starting with slivers, each holding one of
the `max_num_partial_prefills` slots a light request needs); running ones share what is left, least-served
tenant then oldest first. Running or waiting, they yield like long prefills (`long_prefill_yields`) to a step
that admits a request of a tenant served no more. So when a light tenant's request arrives while a heavy
tenant floods large prompts, the step in flight carries at most the cap of them and the light request's
first step none.

Why a cap in tokens: on a GPU a step's time is flat in its tokens up to the compute knee, then grows with
them (llama-3.1-8b on one H200, shared_engine/sim/step_profiles/h200_llama-3.1-8b.json, one prompt alone:
64 tokens 5.7 ms, 128 6.6 ms, 256 8.3 ms, 512 12.1 ms, 1024 22.9 ms, against 5.5 ms for one decode). Without
it, the case_multilora H200 load's whale documents (~250 uncached tokens each, under the 256-token chunk
threshold, so never "long") went two to four at a time into steps of 500-1000 tokens, and the well-behaved
requests in the p99 tail waited for those (case_multilora/the_fix/NOTES.md).

The floor tenant is never capped, so a backlogged least-served tenant gets all the budget it can use and
VTC's bound between backlogged tenants holds; capping a tenant above the floor only slows the growth of a
counter that is already ahead. The cost: while another tenant is live, an over-share tenant's large prompts
prefill at most the cap per step even if the rest of the budget would go unused.
"""

from __future__ import annotations

from shared_engine.core.request import Request


class OverShareCap:
    """One step's cap: first chunks at admission take it first (`before_admitting`), then the running
    over-share prefills held in the first pass (`hold`) share what is left in VTC order (`grant_rest`);
    `granted(request)` is what a running one got."""

    __slots__ = ("left", "tokens", "_counters", "_floor", "_held", "_grants")

    def __init__(self, tokens: int, counters: dict, floor: float) -> None:
        self.left = self.tokens = tokens
        self._counters = counters
        self._floor = floor
        self._held: list[tuple[float, int, Request, int]] = []  # (counter, arrival, request, chunk wanted)
        self._grants: dict[str, int] = {}

    @classmethod
    def for_step(cls, tokens: int, policy) -> OverShareCap | None:
        """This step's cap, or None when it is off (`tokens` 0, or a policy without per-tenant counters) or
        fewer than two tenants have requests in the scheduler."""
        if not tokens:
            return None
        floor = policy.share_floor()
        if floor is None:
            return None
        return cls(tokens, policy.counters, floor)

    def applies(self, request: Request, uncached: int) -> bool:
        """The request's prompt, `uncached` tokens not from the prefix cache, is larger than the cap and its
        tenant is over its share (counter above the floor)."""
        return uncached > self.tokens and self._counters.get(request.tenant, 0.0) > self._floor

    def applies_running(self, request: Request) -> bool:
        """`applies` for a running request (its prompt less what the cache gave it at admission)."""
        return self.applies(request, len(request.prompt_token_ids) - request.num_cached_tokens)

    def hold(self, request: Request, num_new: int) -> None:
        """A running over-share prefill that wants `num_new` tokens this step (granted later, in VTC order)."""
        self._held.append((self._counters.get(request.tenant, 0.0), request.arrival_order, request, num_new))

    def before_admitting(self, request: Request, num_new: int) -> int:
        """How many of its first chunk's `num_new` tokens a waiting over-share request gets, 0 if it must
        wait: its whole chunk if that fits in what is left; the whole cap if no one took any of it and no
        running over-share prefill is held (one long over-share prompt starts at a time); else none. Takes
        them (the caller admits it, or on 0 defers it). Admission goes first: a small first chunk (a light
        tenant's question a little over the floor) never waits for a heavy tenant's running prefill."""
        if num_new <= self.left:
            self.left -= num_new
            return num_new
        if self.left < self.tokens or self._held:
            return 0
        self.left = 0
        return self.tokens

    def give_back(self, num_new: int) -> None:
        """A request `before_admitting` granted tokens to was not admitted after all."""
        self.left += num_new

    def grant_rest(self) -> None:
        """After admission: what is left, to the running over-share prefills, least-served tenant then
        oldest first."""
        self._held.sort(key=lambda h: h[:2])
        for _, _, request, num_new in self._held:
            n = min(num_new, self.left)
            self.left -= n
            self._grants[request.request_id] = n
        self._held.clear()

    def granted(self, request: Request) -> int:
        return self._grants.get(request.request_id, 0)
