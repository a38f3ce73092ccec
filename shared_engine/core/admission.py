"""`Admission`: the scheduler's admission of waiting requests (a mixin of `Scheduler`). Imports no torch.

Waiting requests are admitted in the scheduling policy's order, each with its longest cached prefix and as
many uncached prompt tokens as the step's budget (and the partial-prefill caps, `prefill_caps.py`) leave;
admission stops at the first request the pool cannot take while leaving a small watermark free, so that
admitting does not immediately force running decodes out.

Multi-LoRA (`max_loras` set): the running requests use at most `max_loras` distinct adapters (the model
runner's GPU slots), so a slot is never taken from a running request. A waiting request whose adapter
would exceed the limit is skipped, and so is every adapter request behind it (base-model requests still
pass): no new adapter traffic joins until a slot frees, so the skipped request cannot be starved by a
stream of requests for the adapters already resident.
"""

from __future__ import annotations

from shared_engine.core.prefill_caps import PartialPrefillCaps
from shared_engine.core.request import Request, RequestStatus
from shared_engine.core.scheduler_output import SchedulerOutput
from shared_engine.core.share_cap import OverShareCap

# Leave this fraction of the pool free when admitting new requests, so that admission does not
# immediately force the preemption of running decodes (vLLM v0's watermark).
ADMISSION_WATERMARK = 0.01


class Admission:
    """Mixin: needs the `Scheduler`'s `config`, `block_manager`, `waiting`, `running`, `policy`,
    `max_loras`, `_chunk`, `_now`, `_watermark_blocks`, `_running_loras`, `_add` and
    `num_share_capped_total`."""

    def _admit_waiting(self, out: SchedulerOutput, budget: int, scheduled_ids: set[str],
                       share: OverShareCap | None = None) -> int:
        """Admit waiting requests into `out` within `budget` (returned, less what they took); `share`: this
        step's over-share prefill cap (core/share_cap.py), whose tokens an over-share tenant's first chunk
        takes (`OverShareCap.before_admitting`; a request that gets none waits, and so does one that would
        share the step with the admission of a tenant served no more, `long_prefill_yields`)."""
        bm = self.block_manager
        caps = PartialPrefillCaps.for_step(self.config, self.running)
        free_seqs = self.config.max_num_seqs - len(self.running)
        ordered = self.policy.order(self.waiting, free_seqs) if self.waiting and free_seqs > 0 else None
        if ordered is not None:
            self.waiting.clear()
            self.waiting.extend(ordered)
        deferred: list[Request] = []
        admitted: list[Request] = []  # this step's, for the over-share cap's yield
        active = None if self.max_loras is None else self._running_loras()
        lora_blocked = False
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if active is not None and request.lora_name is not None and (
                    lora_blocked or (request.lora_key not in active and len(active) >= self.max_loras)):
                lora_blocked = True  # see this module's docstring: nothing with an adapter passes it
                deferred.append(self.waiting.popleft())
                continue
            if caps.full_for(_least_uncached(request.num_tokens, bm.block_size)):
                deferred.append(self.waiting.popleft())  # no prefill slot even at its longest possible hit:
                continue  # deferred as below, without its prefix lookup
            cached = bm.find_cached_prefix(request)
            if bm.is_prefix_pending(request, cached.num_blocks):
                deferred.append(self.waiting.popleft())  # its prefix is being computed: reuse it next step
                continue
            num_cached_tokens = cached.num_blocks * bm.block_size
            num_uncached = num_new = request.num_tokens - num_cached_tokens
            if not caps.admits(num_uncached):
                deferred.append(self.waiting.popleft())  # no prefill slot for it: later ones may pass
                continue
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            num_new = self._chunk(num_new, budget)
            capped = share is not None and share.applies(request, num_uncached)
            if capped:  # core/share_cap.py: not with a less-served tenant's admission; within the cap
                if admitted and self.policy.long_prefill_yields(request, admitted):
                    deferred.append(self.waiting.popleft())  # it yields, as a running one would
                    continue
                num_new = share.before_admitting(request, num_new)
                if not num_new:
                    self.num_share_capped_total += 1
                    deferred.append(self.waiting.popleft())  # a less-served tenant's request may still pass
                    continue
            if self.running and not self._above_watermark(request, num_new, cached):
                if capped:
                    share.give_back(num_new)
                break
            fits = bm.can_allocate if self.running else bm.can_allocate_unpinning  # idle: pins give way
            if not fits(request, num_new, cached_blocks=cached):
                if capped:
                    share.give_back(num_new)
                break
            self.waiting.popleft()
            bm.allocate(request, num_new, cached_blocks=cached)
            if bm.enable_prefix_caching:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += num_cached_tokens
                if bm.host is not None:  # vLLM's external prefix cache counters: what missed on the GPU
                    self.host_prefix_cache_queries += request.num_tokens - len(cached) * bm.block_size
                    self.host_prefix_cache_hits += len(cached.host_hashes) * bm.block_size
            if request.first_scheduled_time is None:  # first admission (not a resume after preemption)
                request.num_cached_tokens = num_cached_tokens
                request.first_scheduled_time = self._now
            request.num_computed_tokens = num_cached_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            caps.add(num_uncached)
            if share is not None:
                admitted.append(request)
            if active is not None and request.lora_name is not None:
                active.add(request.lora_key)
            self._add(out, request, num_new, num_new == num_uncached, bm.block_tables[request.request_id],
                      scheduled_ids)
            budget -= num_new
        self.waiting.extendleft(reversed(deferred))
        return budget

    def _above_watermark(self, request: Request, num_new: int, cached) -> bool:
        """Admission leaves a few blocks free so that running decodes are not preempted at once."""
        bm = self.block_manager
        num_cached = cached.num_blocks
        needed = bm.blocks_for_tokens(num_cached * bm.block_size + num_new) - num_cached + bm.num_revived(cached)
        return needed + self._watermark_blocks <= bm.num_free_blocks


def _least_uncached(num_tokens: int, block_size: int) -> int:
    """The fewest uncached tokens a prompt of `num_tokens` can have: a prefix hit covers at most its
    `(num_tokens - 1) // block_size` first full blocks (`BlockManager.find_cached_prefix`)."""
    return num_tokens - (num_tokens - 1) // block_size * block_size
