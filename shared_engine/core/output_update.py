"""`OutputUpdate`: the scheduler's side of a step's results (a mixin of `Scheduler`). Imports no torch.

A step's results reach the scheduler in two halves, so that with async scheduling step n+1 can be
scheduled while step n still runs: `apply_launched` (what a launched step will have done, known without
its tokens) and `resolve` (its sampled tokens). Between the two, each sampling request's last output
token is a placeholder, -(i + 1) for the step's i-th sampled row, which the model runner replaces on
the device with that row's sampled id when the placeholder is the input of the next step. A placeholder
stands for all the tokens its row yields (1 to k + 1 with draft tokens); since how many is known only
when the step is collected, a step with drafts must be resolved before the next `schedule`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared_engine.core.request import Request, RequestStatus
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput


class OutputUpdate:
    """Mixin: needs the `Scheduler`'s `block_manager`, `policy`, `max_model_len`, `_drafts_in_flight` and
    `finish_request`."""

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
