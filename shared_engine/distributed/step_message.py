"""What rank 0 sends the other ranks each step: its `SchedulerOutput`, with each `Request` replaced by what
a non-sampling rank's model runner reads (`RequestStub`: the request id, and the prompt when the request
asks for prompt logprobs, whose logits every rank must compute together). Every other field of
`SchedulerOutput` and `ScheduledRequest` travels as it is (a field added there reaches the workers), each
scheduled request as one plain tuple. 256 decodes with 63-block tables (55 KB): encode + pickle 0.8 ms, unpickle +
decode 1.8 ms on this 2-core CPU at load average ~10 (stubbed dataclasses, pickled whole, took 4 ms to send). vLLM
sends block-table diffs through a shared-memory ring buffer instead; here the whole table goes every step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput

_FIELDS = tuple(f.name for f in dataclasses.fields(ScheduledRequest) if f.name != "request")
assert dataclasses.fields(ScheduledRequest)[0].name == "request"  # decode() passes the fields positionally


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


def encode(out: SchedulerOutput) -> tuple:
    """Rank 0: `out` as (its other fields, one tuple per scheduled request)."""
    rows = []
    for item in out.scheduled:
        request = item.request
        wanted = request.sampling_params.prompt_logprobs
        prompt = list(request.prompt_token_ids) if wanted is not None else None
        rows.append((request.request_id, request.num_prompt_tokens, wanted, prompt,
                     *[getattr(item, name) for name in _FIELDS]))
    return dataclasses.replace(out, scheduled=[]), rows


def decode(message: tuple) -> SchedulerOutput:
    """Ranks 1..N-1: the `SchedulerOutput` of `encode`, with `RequestStub`s for requests."""
    out, rows = message
    plain = StubParams()
    out.scheduled = [
        ScheduledRequest(RequestStub(rid, num_prompt, plain if wanted is None else StubParams(wanted), prompt or []),
                         *values)
        for rid, num_prompt, wanted, prompt, *values in rows]
    return out
