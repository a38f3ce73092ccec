"""`fair`: the virtual token counter (VTC; Sheng et al., "Fairness in Serving Large Language Models",
OSDI 2024), per `tenant`.

Each tenant has a counter of the weighted service it got: `prefill_weight` (1) per prompt token computed
(a prefix-cache hit counts: the tenant was served those tokens) and `decode_weight` (2) per output token,
charged as a step's results come back. A recompute after preemption is not charged again (a per-request
high-water mark). Waiting requests are admitted from the tenant with the lowest counter, oldest request
first within a tenant; the order for one step is built greedily, each pick adding its uncharged prompt
tokens to its tenant's counter before the next pick, as VTC charges a prompt on admission.

A tenant with no waiting request that sends one is lifted to the lowest counter among the tenants that
have waiting requests (or, if none has, to the counter of the tenant most recently admitted), so idle
time earns no credit. Requests without a tenant share one counter (tenant None). Counters of tenants with
no live request are kept; when there are more than 2 * `_MAX_DEPARTED` of them, all but the highest
`_MAX_DEPARTED` are dropped (a tenant at or below the floor loses nothing, the lift restores it; one above
it loses at most the lead its last requests gave it), so a stream of distinct tenant names cannot grow the
table without bound. Running requests are not preempted for fairness; preemption keeps the scheduler's
default (the most recent arrival).

Long prefills yield (with `long_prefill_token_threshold` set, `yields_long_prefills`): a running request
with more than the threshold of its prompt left skips a step in which a request of another tenant whose
counter is at most its own tenant's was admitted, so that tenant's first step holds no chunk of the other's
long prompt. Chunked prefill alone (the threshold) only caps that chunk: on a machine whose step time grows
with its tokens (a CPU, or a GPU past the compute knee) the light tenant's first token still waits for a
step that carries the heavy tenant's chunk. Yielding is VTC applied to prefill chunks: only a tenant served
no more than the long request's tenant is let ahead (a lower or equal counter), and each admission charges
its prompt, so a stream of light requests cannot stall the long prompt for good: it waits while they are
below its tenant's counter. Decodes never yield.

Over-share prefill cap (with `over_share_prefill_tokens` set; core/share_cap.py): while two or more tenants
have requests, the prompts larger than that cap of tenants whose counter is above the lowest get at most
the cap of prefill tokens per step in all, and their running prefills (not only long ones) yield like long
prefills do, so the step in flight when a light request arrives carries at most the cap of a heavy tenant's
prompts and its first step usually none.

Bound (VTC, Theorem 4.3): while two tenants are backlogged, their counters stay within
2 * max(prefill_weight * max prompt tokens, decode_weight * max output tokens in the batch) of each other.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

from shared_engine.core.request import Request
from shared_engine.core.scheduling.registry import SchedulingPolicy, register_scheduling_policy

_MAX_DEPARTED = 256  # counters kept for tenants with no live request (beyond that, the lowest are dropped)


def _num_outputs(request: Request) -> int:
    """Generated tokens known so far (placeholders of a step in flight excluded)."""
    outputs = request.output_token_ids
    n = len(outputs)
    while n and outputs[n - 1] < 0:
        n -= 1
    return n


@register_scheduling_policy("fair")
class FairPolicy(SchedulingPolicy):
    name = "fair"
    tracks_service = True
    yields_long_prefills = True

    def __init__(self, prefill_weight: float = 1.0, decode_weight: float = 2.0) -> None:
        self.prefill_weight = prefill_weight
        self.decode_weight = decode_weight
        self.counters: dict[str | None, float] = {}
        self._charged: dict[str, tuple[int, int]] = {}  # request id -> (prompt tokens, output tokens) charged
        self._last_admitted: float = 0.0  # counter of the tenant most recently admitted
        self._live: dict[str | None, int] = {}  # tenant -> its requests in the scheduler

    def on_arrival(self, request: Request, waiting: deque[Request]) -> None:
        tenant = request.tenant
        self._live[tenant] = self._live.get(tenant, 0) + 1
        backlogged = {r.tenant for r in waiting}
        if tenant in backlogged:
            return
        floor = min(self.counters.get(t, 0.0) for t in backlogged) if backlogged else self._last_admitted
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)

    def order(self, waiting: deque[Request], limit: int) -> list[Request]:
        """The first `limit` in VTC order, the rest by arrival. Each pick costs a heap step (~1 us here),
        so only what can be admitted is ordered; a request skipped for a blocked adapter or a pending
        prefix still takes one of the `limit` places (such a step may admit a few in arrival order)."""
        by_arrival = sorted(waiting, key=lambda r: r.arrival_order)
        queues: dict[str | None, list[Request]] = {}
        for request in by_arrival:
            queues.setdefault(request.tenant, []).append(request)
        heap = [(self.counters.get(t, 0.0), q[0].arrival_order, i, t) for i, (t, q) in enumerate(queues.items())]
        heapq.heapify(heap)
        position = dict.fromkeys(queues, 0)
        ordered: list[Request] = []
        charged, weight = self._charged, self.prefill_weight
        while heap and len(ordered) < limit:
            counter, _, i, tenant = heapq.heappop(heap)
            queue, k = queues[tenant], position[tenant]
            rival = heap[0][:3] if heap else None
            # take this tenant's requests while it stays the minimum (what a push and pop would return)
            while True:
                request = queue[k]
                ordered.append(request)
                k += 1
                if k == len(queue) or len(ordered) >= limit:
                    break
                done = charged[request.request_id][0] if request.request_id in charged else 0
                counter += weight * (len(request.prompt_token_ids) - done)
                key = (counter, queue[k].arrival_order, i)
                if rival is not None and key > rival:
                    heapq.heappush(heap, (*key, tenant))
                    break
            position[tenant] = k
        if len(ordered) < len(by_arrival):
            taken = {id(r) for r in ordered}
            ordered.extend(r for r in by_arrival if id(r) not in taken)
        return ordered

    def long_prefill_yields(self, request: Request, admitted: list[Request]) -> bool:
        """True when a request of another tenant with a counter at most the long request's tenant's was
        admitted this step (counters as they stand before the step is charged)."""
        counters = self.counters
        own = counters.get(request.tenant, 0.0)
        return any(r.tenant != request.tenant and counters.get(r.tenant, 0.0) <= own for r in admitted)

    def share_floor(self) -> float | None:
        """The lowest counter among the tenants with live requests; None with fewer than two (one pass over
        them, once per step when `over_share_prefill_tokens` is set)."""
        live = self._live
        if len(live) < 2:
            return None
        counters = self.counters
        return min(counters.get(t, 0.0) for t in live)

    def _prune(self) -> None:
        """Keep the `_MAX_DEPARTED` highest counters of tenants with no live request; drop the rest."""
        live, counters = self._live, self.counters
        departed = sorted((c, i, t) for i, (t, c) in enumerate(counters.items()) if t not in live)
        for _, _, tenant in departed[:len(departed) - _MAX_DEPARTED]:
            del counters[tenant]

    def _charge(self, request: Request) -> None:
        """Add the service the request got since its last charge to its tenant's counter."""
        rid, tenant = request.request_id, request.tenant
        first = rid not in self._charged
        prompt_done, outputs_done = self._charged.get(rid, (0, 0))
        prompt = max(prompt_done, min(request.num_computed_tokens, len(request.prompt_token_ids)))
        outputs = max(outputs_done, _num_outputs(request))
        served = self.prefill_weight * (prompt - prompt_done) + self.decode_weight * (outputs - outputs_done)
        if first:
            if not served:
                return  # never served (aborted while waiting)
            self._last_admitted = self.counters.get(tenant, 0.0)  # it just left the waiting queue
        if served:
            self.counters[tenant] = self.counters.get(tenant, 0.0) + served
        self._charged[rid] = (prompt, outputs)

    def on_served(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._charge(request)

    def on_finished(self, request: Request) -> None:
        self._charge(request)  # its last step's tokens (a request may finish on its first step)
        self._charged.pop(request.request_id, None)
        tenant = request.tenant
        n = self._live.get(tenant, 0) - 1
        if n > 0:
            self._live[tenant] = n
            return
        self._live.pop(tenant, None)
        if len(self.counters) > len(self._live) + 2 * _MAX_DEPARTED:  # amortised: a sort every _MAX_DEPARTED
            self._prune()
