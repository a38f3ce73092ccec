"""`Scheduler`: continuous batching with chunked prefill and preemption by recompute.

Every step it spends a token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`):
running requests first (decodes, 1 token each, then unfinished prefill chunks), then waiting requests in
arrival order (`admission.py`), each getting as many prompt tokens as the budget leaves (a chunk). When the
KV pool runs dry it preempts by recompute: the most recently arrived running request loses its blocks and
goes back to the front of the waiting queue (Orca, Yu et al. 2022; vLLM's recompute preemption). A step's
results come back through `output_update.py`. Imports no torch.

Speculative decoding: a decoding request whose proposer left `draft_token_ids` is scheduled with up to k of
them after its last token (k + 1 query tokens, all inside the token budget), never past `max_tokens` or
`max_model_len`, and only when its blocks already have or can get the lookahead slots without preempting
anyone. `resolve` appends the step's accepted tokens one at a time, stopping at the first that ends the
request, rewinds `num_computed_tokens` past the rejected drafts (so only verified tokens reach the prefix
cache), and returns the blocks that held nothing but rejected slots.

Helpers: partial-prefill caps (`prefill_caps.py`), session pins (`session_pins.py`, expired at `schedule(now)`).

Scheduling policy (`config.scheduling_policy`, core/scheduling/): the order in which waiting requests are
admitted and the preemption victim. `fcfs` (the default) keeps the queue's order as described above;
`priority` and `fair` (per-tenant virtual token counters) reorder the waiting queue before admission.
A policy with `yields_long_prefills` (`fair`), given `long_prefill_token_threshold`, also decides after
admission whether each running long prefill gets its chunk this step or yields to the requests just
admitted (core/scheduling/fair.py); with `over_share_prefill_tokens` the large prompts of the tenants above
the least-served one get at most that many prefill tokens per step in all (core/share_cap.py).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterator

from shared_engine.config.scheduler_config import SchedulerConfig
from shared_engine.core.admission import ADMISSION_WATERMARK, Admission
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.output_update import OutputUpdate
from shared_engine.core.prefill_caps import PartialPrefillCaps
from shared_engine.core.request import Request, RequestStatus
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.core.scheduling import make_scheduling_policy
from shared_engine.core.share_cap import OverShareCap

_ARRIVAL_ORDER = operator.attrgetter("arrival_order")


def _step_order(item: ScheduledRequest) -> int:
    return 0 if item.is_decode else 1 if item.num_draft_tokens else 2


def build_scheduler(config, num_blocks: int, max_model_len: int, num_host_blocks: int = 0) -> Scheduler:
    """The scheduler and block manager for an `EngineConfig`, built one way for the engine and the capacity
    model alike (so the simulator can never drift from what the engine decides); `num_host_blocks`: the KV
    offload tier (`CacheConfig.num_host_blocks`)."""
    cache = config.cache
    block_manager = BlockManager.from_config(num_blocks, cache, num_host_blocks)
    max_loras = config.lora.max_loras if config.lora.enable_lora else None
    return Scheduler(config.scheduler, block_manager, max_model_len, max_loras)


class Scheduler(Admission, OutputUpdate):
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int,
                 max_loras: int | None = None) -> None:
        self.config = config
        self.max_loras = max_loras
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions_total = 0
        self.num_prefill_yields_total = 0  # long prefills that sat a step out for an admission (policy's rule)
        self.num_share_capped_total = 0  # large over-share prefills (running or waiting) kept out by the cap
        self._now: float | None = None
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache at admission
        self.prefix_cache_hits = 0  # of those, tokens served from it (host tier included)
        self.host_prefix_cache_queries = 0  # KV offload: tokens looked up in the host tier (GPU misses)
        self.host_prefix_cache_hits = 0  # of those, tokens restored from it
        self._watermark_blocks = int(ADMISSION_WATERMARK * block_manager.num_blocks)
        self._drafts_in_flight = False  # a launched step with drafts is not resolved yet
        self._chunk = PartialPrefillCaps.chunker(config)  # (remaining, budget) -> tokens this step
        self.policy = make_scheduling_policy(config.scheduling_policy)

    # ---- queue management ----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.policy.on_arrival(request, self.waiting)
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> Request | None:
        """Finish the request as aborted and free its blocks at once. Unknown ids are ignored."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        self.finish_request(request, RequestStatus.FINISHED_ABORTED)
        return request

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ------------------------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Choose this step's work. `now` (seconds, the caller's clock) stamps first scheduling times."""
        if self._drafts_in_flight:
            raise RuntimeError("a step with draft tokens must be resolved before the next one is scheduled")
        self._now = now
        self.block_manager.expire_pins(now)
        out = SchedulerOutput()
        budget = self.config.token_budget
        scheduled_ids: set[str] = set()
        block_tables, block_size = self.block_manager.block_tables, self.block_manager.block_size
        threshold = self.config.long_prefill_token_threshold if self.policy.yields_long_prefills else 0
        share = OverShareCap.for_step(self.config.over_share_prefill_tokens, self.policy)  # None: no cap
        long_prefills: list[tuple[Request, int, list[int], int]] = []  # (request, chunk, blocks, left): may yield
        for request, remaining in self._running_in_order():
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = self._chunk(remaining, budget)
            capped = share is not None and remaining > 1 and share.applies_running(request)
            # More tokens than the held blocks have slots for? Most decode steps still fit in the last block.
            table = block_tables.get(request.request_id, ())
            num_drafts = 0
            if remaining == 1 and request.draft_token_ids:
                num_drafts = self._num_drafts(request, budget - 1, table)
            num_new += num_drafts
            if request.num_computed_tokens + num_new > len(table) * block_size:
                if not self._reserve(request, num_new, scheduled_ids, out):
                    continue
                table = block_tables[request.request_id]
            if capped or (threshold and remaining > threshold):  # chunk and blocks held; added after admission
                if capped:  # an over-share tenant's prefill: the cap's tokens are granted in VTC order
                    share.hold(request, num_new)
                long_prefills.append((request, num_new, table, remaining))  # unless it yields
                scheduled_ids.add(request.request_id)  # not a preemption victim in this step
            else:
                self._add(out, request, num_new, num_new == remaining + num_drafts, table, scheduled_ids, num_drafts)
            budget -= num_new
        if out.num_draft_tokens:  # decodes, speculative decodes, prefill chunks (the input builder's order)
            out.scheduled.sort(key=_step_order)
        admitted_from = len(out.scheduled)
        if not out.preempted_request_ids:
            budget = self._admit_waiting(out, budget, scheduled_ids, share)
        if long_prefills:
            admitted = [item.request for item in out.scheduled[admitted_from:]]
            if share is not None:
                share.grant_rest()
            budget = self._add_long_prefills(out, long_prefills, admitted, budget, share)
        if self.max_loras is not None:
            out.running_loras = frozenset(self._running_loras())
        if self.block_manager.host is not None:
            out.kv_offloads, out.kv_restores = self.block_manager.take_copies()
        return out

    def _add_long_prefills(self, out: SchedulerOutput, long_prefills: list[tuple[Request, int, list[int], int]],
                           admitted: list[Request], budget: int, share: OverShareCap | None = None) -> int:
        """The running long prefills (and over-share prefills, core/share_cap.py) whose chunks and blocks the
        first pass held back, for a policy with `yields_long_prefills`: each is added to the step unless the
        policy makes it yield to the requests `admitted` in it; a yielding one keeps its blocks for the next
        step and gives its chunk back to the budget (left unused: the step stays short). An over-share one
        gets what `share` granted it (none: it sits the step out too). Returns the budget; counts the
        yields and the capped-out chunks."""
        for request, num_new, table, remaining in long_prefills:
            if admitted and self.policy.long_prefill_yields(request, admitted):
                self.num_prefill_yields_total += 1
                budget += num_new
                continue
            if share is not None and share.applies_running(request):
                granted = share.granted(request)
                budget += num_new - granted
                if not granted:
                    self.num_share_capped_total += 1
                    continue
                num_new = granted
            self._add(out, request, num_new, num_new == remaining, table, set())
        return budget

    def _running_loras(self) -> set:
        return {r.lora_key for r in self.running if r.lora_name is not None}

    def _running_in_order(self) -> Iterator[tuple[Request, int]]:
        """Running requests with their tokens left to compute: decodes (one token) first, then partial
        prefills; each group in arrival order. Lazy: a request preempted before its turn comes is still
        yielded (its status tells)."""
        prefills = []
        ends_in_flight = self._ends_in_flight
        for request in sorted(self.running, key=_ARRIVAL_ORDER):
            if ends_in_flight(request):
                continue  # nothing left to run
            remaining = request.num_remaining_tokens
            if remaining > 1:
                prefills.append((request, remaining))
            else:
                yield request, remaining
        yield from prefills

    def _num_drafts(self, request: Request, budget: int, table) -> int:
        """How many of the request's draft tokens this step verifies: none while its last token is in
        flight, none at a position past max_tokens or max_model_len, none beyond the budget, and none that
        would need a block the pool cannot give without preempting someone."""
        outputs = request.output_token_ids
        if outputs and outputs[-1] < 0:
            return 0
        # drafts cover at most the positions left (a bonus token past max_tokens is dropped by `check_stop`)
        n = min(len(request.draft_token_ids), budget, request.max_tokens - len(outputs),
                self.max_model_len - request.num_tokens)
        if n <= 0:
            return 0
        bm = self.block_manager
        if request.num_computed_tokens + 1 + n > len(table) * bm.block_size and not bm.can_allocate(request, 1 + n):
            return 0
        return n

    def _ends_in_flight(self, request: Request) -> bool:
        """Async scheduling: the request's last token is in flight and ends it by length."""
        outputs = request.output_token_ids
        return bool(outputs) and outputs[-1] < 0 and (
            len(outputs) >= request.max_tokens or request.num_tokens >= self.max_model_len)

    def _reserve(self, request: Request, num_new: int, scheduled_ids: set[str], out: SchedulerOutput) -> bool:
        """Allocate the blocks `num_new` more tokens of a running request need, preempting newer requests
        while the pool is short. False when the request itself was preempted, or, with async scheduling,
        when requests that end with the step in flight hold blocks: those return when it is resolved, so
        the request waits a step instead of costing someone a recompute."""
        if not self.block_manager.can_allocate(request, num_new) and any(
                self._ends_in_flight(r) for r in self.running):
            return False
        while not self.block_manager.can_allocate(request, num_new):
            victim = max(
                (r for r in self.running if r.request_id not in scheduled_ids),
                key=self.policy.preemption_key,
            )
            self._preempt(victim, out)
            if victim is request:
                return False
        self.block_manager.allocate(request, num_new)
        return True


    def _add(self, out: SchedulerOutput, request: Request, num_new: int, needs_sample: bool, block_table: list[int],
             scheduled_ids: set[str], num_drafts: int = 0) -> None:
        """Schedule tokens [num_computed_tokens, + num_new) of the request (whose blocks, `block_table`, have
        slots for them), the last `num_drafts` of them its first draft tokens; `needs_sample` when they reach
        its last known token."""
        start = request.num_computed_tokens
        if num_drafts:
            token_ids = request.token_ids_slice(start, start + 1) + request.draft_token_ids[:num_drafts]
            request.draft_token_ids = []  # used once: the proposer drafts again after the step
            out.num_draft_tokens += num_drafts
            item = ScheduledRequest(request, token_ids, start, block_table, needs_sample, num_drafts)
        else:
            token_ids = request.token_ids_slice(start, start + num_new)
            # positional arguments: one of these is built per request per step
            item = ScheduledRequest(request, token_ids, start, block_table, needs_sample)
        out.scheduled.append(item)
        out.num_batched_tokens += num_new
        scheduled_ids.add(request.request_id)

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.draft_token_ids = []
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self.num_preemptions_total += 1
        out.preempted_request_ids.append(request.request_id)

    def finish_request(self, request: Request, status: RequestStatus, now: float | None = None) -> None:
        """Take the request out of its queue, free its blocks and mark it finished with `status`."""
        self.policy.on_finished(request)
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request, now)  # `now` (a normal finish) pins a session's prefix
        request.status = status
        request.finished_time = now if now is not None else request.last_token_time
        self.requests.pop(request.request_id, None)

