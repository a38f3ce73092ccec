"""What rank 0 sends the other ranks each step: the `SchedulerOutput` with each `Request` replaced by a
`RequestStub` holding only what a non-sampling rank's model runner reads (its id, and the prompt when
the request asks for prompt logprobs, whose logits every rank must compute together). Every other field
of `SchedulerOutput` and `ScheduledRequest` travels as it is, so a field added there reaches the workers.

Size: per scheduled request its new token ids and its whole block table (about 64 ids for a 1,000-token
context at block size 16), pickled once and broadcast over the CPU process group. vLLM sends block-table
diffs through a shared-memory ring buffer instead; at 256 decodes a full message here is ~100 KB.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from shared_engine.core.scheduler_output import SchedulerOutput


@dataclass(frozen=True, slots=True)
class StubParams:
    prompt_logprobs: int | None = None


@dataclass(slots=True)
class RequestStub:
    """Stands in for `Request` on ranks 1..N-1 (which never sample, detokenise or schedule)."""

    request_id: str
    num_prompt_tokens: int
    sampling_params: StubParams
    prompt_token_ids: list[int] = field(default_factory=list)  # only with prompt logprobs


def _stub(request) -> RequestStub:
    wanted = request.sampling_params.prompt_logprobs
    return RequestStub(request.request_id, request.num_prompt_tokens, StubParams(wanted),
                       list(request.prompt_token_ids) if wanted is not None else [])


def worker_view(out: SchedulerOutput) -> SchedulerOutput:
    """`out` as the other ranks see it (requests stubbed; see the module docstring)."""
    scheduled = [dataclasses.replace(item, request=_stub(item.request)) for item in out.scheduled]
    return dataclasses.replace(out, scheduled=scheduled)
