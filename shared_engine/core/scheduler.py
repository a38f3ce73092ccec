"""`Scheduler`: continuous batching with chunked prefill and preemption by recompute.

Every step it spends a token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`):
running requests first (decodes, 1 token each, then unfinished prefill chunks), then waiting requests in
arrival order, each getting as many prompt tokens as the budget leaves (a chunk). When the KV pool runs
dry it preempts by recompute: the most recently arrived running request loses its blocks and goes back to
the front of the waiting queue (Orca, Yu et al. 2022; vLLM's recompute preemption). Imports no torch.

Speculative decoding: a decoding request whose proposer left `draft_token_ids` is scheduled with up to k of
them after its last token (k + 1 query tokens, all inside the token budget), never past `max_tokens` or
`max_model_len`, and only when its blocks already have or can get the lookahead slots without preempting
anyone. `resolve` appends the step's accepted tokens one at a time, stopping at the first that ends the
request, rewinds `num_computed_tokens` past the rejected drafts (so only verified tokens reach the prefix
cache), and returns the blocks that held nothing but rejected slots.

Multi-LoRA (`max_loras` set): the running requests use at most `max_loras` distinct adapters (the model
runner's GPU slots), so a slot is never taken from a running request. A waiting request whose adapter
would exceed the limit is skipped, and so is every adapter request behind it (base-model requests still
pass): no new adapter traffic joins until a slot frees, so the skipped request cannot be starved by a
stream of requests for the adapters already resident.

Helpers: partial-prefill caps (`prefill_caps.py`), session pins (`session_pins.py`, expired at `schedule(now)`).

Scheduling policy (`config.scheduling_policy`, core/scheduling/): the order in which waiting requests are
admitted and the preemption victim. `fcfs` (the default) keeps the queue's order as described above;
`priority` and `fair` (per-tenant virtual token counters) reorder the waiting queue before admission.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

from shared_engine.config.scheduler_config import SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.prefill_caps import PartialPrefillCaps
from shared_engine.core.request import Request, RequestStatus
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.core.scheduling import make_scheduling_policy

# Leave this fraction of the pool free when admitting new requests, so that admission does not
# immediately force the preemption of running decodes (vLLM v0's watermark).
_ADMISSION_WATERMARK = 0.01


_ARRIVAL_ORDER = operator.attrgetter("arrival_order")


def _step_order(item: ScheduledRequest) -> int:
    return 0 if item.is_decode else 1 if item.num_draft_tokens else 2


def build_scheduler(config, num_blocks: int, max_model_len: int) -> Scheduler:
    """The scheduler and block manager for an `EngineConfig`, built one way for the engine and the capacity
    model alike (so the simulator can never drift from what the engine decides)."""
    cache = config.cache
    block_manager = BlockManager.from_config(num_blocks, cache)
    max_loras = config.lora.max_loras if config.lora.enable_lora else None
    return Scheduler(config.scheduler, block_manager, max_model_len, max_loras)


class Scheduler:
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
        self._now: float | None = None
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache at admission
        self.prefix_cache_hits = 0  # of those, tokens served from it
        self._watermark_blocks = int(_ADMISSION_WATERMARK * block_manager.num_blocks)
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
        for request, remaining in self._running_in_order():
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = self._chunk(remaining, budget)
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
            self._add(out, request, num_new, num_new == remaining + num_drafts, table, scheduled_ids, num_drafts)
            budget -= num_new
        if out.num_draft_tokens:  # decodes, speculative decodes, prefill chunks (the input builder's order)
            out.scheduled.sort(key=_step_order)
        if not out.preempted_request_ids:
            budget = self._admit_waiting(out, budget, scheduled_ids)
        if self.max_loras is not None:
            out.running_loras = frozenset(self._running_loras())
        return out

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

    def _admit_waiting(self, out: SchedulerOutput, budget: int, scheduled_ids: set[str]) -> int:
        bm = self.block_manager
        caps = PartialPrefillCaps.for_step(self.config, self.running)
        free_seqs = self.config.max_num_seqs - len(self.running)
        ordered = self.policy.order(self.waiting, free_seqs) if self.waiting and free_seqs > 0 else None
        if ordered is not None:
            self.waiting.clear()
            self.waiting.extend(ordered)
        deferred: list[Request] = []
        active = None if self.max_loras is None else self._running_loras()
        lora_blocked = False
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if active is not None and request.lora_name is not None and (
                    lora_blocked or (request.lora_key not in active and len(active) >= self.max_loras)):
                lora_blocked = True  # see the module docstring: nothing with an adapter passes it
                deferred.append(self.waiting.popleft())
                continue
            cached = bm.find_cached_prefix(request)
            if bm.is_prefix_pending(request, len(cached)):
                deferred.append(self.waiting.popleft())  # its prefix is being computed: reuse it next step
                continue
            num_cached_tokens = len(cached) * bm.block_size
            num_uncached = num_new = request.num_tokens - num_cached_tokens
            if not caps.admits(num_uncached):
                deferred.append(self.waiting.popleft())  # no prefill slot for it: later ones may pass
                continue
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            num_new = self._chunk(num_new, budget)
            if self.running and not self._above_watermark(request, num_new, cached):
                break
            fits = bm.can_allocate if self.running else bm.can_allocate_unpinning  # idle: pins give way
            if not fits(request, num_new, cached_blocks=cached):
                break
            self.waiting.popleft()
            bm.allocate(request, num_new, cached_blocks=cached)
            if bm.enable_prefix_caching:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += num_cached_tokens
            if request.first_scheduled_time is None:  # first admission (not a resume after preemption)
                request.num_cached_tokens = num_cached_tokens
                request.first_scheduled_time = self._now
            request.num_computed_tokens = num_cached_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            caps.add(num_uncached)
            if active is not None and request.lora_name is not None:
                active.add(request.lora_key)
            self._add(out, request, num_new, num_new == num_uncached, bm.block_tables[request.request_id],
                      scheduled_ids)
            budget -= num_new
        self.waiting.extendleft(reversed(deferred))
        return budget

    def _above_watermark(self, request: Request, num_new: int, cached: list[int]) -> bool:
        """Admission leaves a few blocks free so that running decodes are not preempted at once."""
        bm = self.block_manager
        revived = sum(1 for b in cached if bm.ref_counts[b] == 0)
        needed = bm.blocks_for_tokens(len(cached) * bm.block_size + num_new) - len(cached) + revived
        return needed + self._watermark_blocks <= bm.num_free_blocks

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

    # ---- after the model ran -------------------------------------------------------------------------
    # A step's results reach the scheduler in two halves, so that with async scheduling step n+1 can be
    # scheduled while step n still runs: `apply_launched` (what a launched step will have done, known without
    # its tokens) and `resolve` (its sampled tokens). Between the two, each sampling request's last output
    # token is a placeholder, -(i + 1) for the step's i-th sampled row, which the model runner replaces on
    # the device with that row's sampled id when the placeholder is the input of the next step. A placeholder
    # stands for all the tokens its row yields (1 to k + 1 with draft tokens); since how many is known only
    # when the step is collected, a step with drafts must be resolved before the next `schedule`.
    def update_from_output(
        self, out: SchedulerOutput, sampled: Mapping[str, Sequence[int]], now: float = 0.0
    ) -> list[Request]:
        """Advance progress, append sampled tokens, and finish requests that stop (both halves at once).

        `sampled` maps request ids (those with `needs_sample`) to their new tokens (one, or a speculative
        decode's accepted drafts plus its bonus token). Returns the requests that were updated (got a token
        or finished) in this step.
        """
        self.apply_launched(out, now)
        return self.resolve(out, sampled, now)

    def apply_launched(self, out: SchedulerOutput, now: float = 0.0) -> None:
        """Record a launched step's progress: the KV of its tokens is (being) computed, and every request it
        samples gets a placeholder last token (its position is known, its value is not). A speculative
        decode counts all its draft slots as computed until `resolve` rewinds past the rejected ones."""
        sample_row = 0
        for item in out.scheduled:
            request = item.request
            if item.needs_sample:
                sample_row += 1
            if request.is_finished:
                continue  # aborted (or stopped by a stop string) while the step ran
            request.num_computed_tokens += len(item.token_ids)
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            if item.needs_sample:
                request.output_token_ids.append(-sample_row)
        self._drafts_in_flight = out.num_draft_tokens > 0

    def resolve(self, out: SchedulerOutput, sampled: Mapping[str, Sequence[int]], now: float = 0.0) -> list[Request]:
        """Put a collected step's sampled tokens in place of its placeholders, register the blocks its
        verified tokens filled with the prefix cache, and finish requests that stop (EOS, a stop token id,
        max_tokens, max_model_len), at the first accepted token that stops them. Must come after the step's
        `apply_launched` and before the next one's. Returns the requests that got a token."""
        updated = []
        cache_computed_blocks = self.block_manager.cache_computed_blocks
        for item in out.scheduled:
            request = item.request
            if request.is_finished:
                continue
            tokens = sampled.get(request.request_id)
            if tokens is None:
                if request.status is RequestStatus.RUNNING:
                    cache_computed_blocks(request)
                continue
            status = self._append(request, item, tokens)
            if request.status is RequestStatus.RUNNING:
                cache_computed_blocks(request)
            if request.first_token_time is None:
                request.first_token_time = now
            request.last_token_time = now
            if status is not None:
                self.finish_request(request, status, now)
            elif item.num_draft_tokens:
                self.block_manager.trim(request, request.num_tokens)
            updated.append(request)
        if self.policy.tracks_service:
            self.policy.on_served([item.request for item in out.scheduled if not item.request.is_finished])
        self._drafts_in_flight = False
        return updated

    def _append(self, request: Request, item: ScheduledRequest, tokens: Sequence[int]) -> RequestStatus | None:
        """Replace the request's placeholder with `tokens`, one at a time, up to the first that ends it."""
        outputs = request.output_token_ids
        if not outputs or outputs[-1] >= 0:
            raise RuntimeError(f"request {request.request_id}: no placeholder for its sampled token")
        if len(tokens) == 1:
            outputs[-1] = tokens[0]
            status = request.check_stop(self.max_model_len)
        else:
            outputs.pop()
            for token in tokens:
                outputs.append(token)
                status = request.check_stop(self.max_model_len)
                if status is not None:
                    break
        if item.num_draft_tokens:
            request.num_draft_tokens_total += item.num_draft_tokens
            request.num_accepted_tokens_total += len(tokens) - 1
            request.num_computed_tokens = request.num_tokens - 1  # the rejected drafts' KV is not verified
        return status

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
