"""`Request`: one sequence's scheduling state (prompt, generated tokens, progress, timings)."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from shared_engine.sampling_params import SamplingParams

_arrival_counter = itertools.count()


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self._finished  # precomputed below: this is read for every request at every step


for _status in RequestStatus:
    _status._finished = _status.name.startswith("FINISHED")


@dataclass(eq=False)  # identity, not field-wise equality: queues remove and find requests by identity
class Request:
    """One sequence. A request with `n` > 1 is fanned out into `n` of these by the engine.

    The scheduler sees only token counts: `num_tokens` (prompt + generated) and `num_computed_tokens`
    (tokens whose KV is in the cache). Preemption by recompute sets `num_computed_tokens` back to 0 and
    keeps the generated tokens, so the request later recomputes prompt + output as one longer prompt.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: never None
    eos_token_ids: frozenset[int] = frozenset()
    arrival_time: float = 0.0
    parent_id: str | None = None
    index: int = 0  # which of the parent's n choices
    cache_salt: str | None = None
    # scheduling policy inputs: `priority` (lower first; `--scheduling-policy priority`) and `tenant` (whose
    # virtual token counter it charges; `--scheduling-policy fair`)
    priority: int = 0
    tenant: str | None = None
    # the agent session this turn belongs to (`X-Session-Id`): its cached prefix is pinned for
    # `session_pin_ttl` seconds after it finishes, until the session's next turn (core/session_pins.py)
    session_id: str | None = None
    # The adapter (None: the base model). `lora_name` and `lora_version` key the prefix cache and count
    # toward the scheduler's `max_loras`; `lora_request` (a `shared_engine.lora.LoRARequest`, plain data)
    # tells the model runner which weights to load. Given a `lora_request`, the other two come from it.
    lora_name: str | None = None
    lora_version: str | None = None
    lora_request: object | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first schedule
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    arrival_order: int = field(default_factory=lambda: next(_arrival_counter))
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    # speculative decoding: the proposer's guesses after the last token, read by the next `schedule` (which
    # may take fewer); accepted / drafted counts of this request's verified drafts (its acceptance rate)
    draft_token_ids: list[int] = field(default_factory=list)
    num_draft_tokens_total: int = 0
    num_accepted_tokens_total: int = 0

    def __post_init__(self) -> None:
        if self.lora_request is not None:
            self.lora_name = self.lora_request.lora_name
            self.lora_version = self.lora_request.cache_key

    @property
    def lora_key(self) -> tuple[str, str | None] | None:
        """The adapter's identity for slot accounting (name and version), or None for the base model."""
        return None if self.lora_name is None else (self.lora_name, self.lora_version)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens not yet in the KV cache (the whole prompt before its first step, 1 while decoding)."""
        # `num_tokens` spelled out: the scheduler reads this twice per running request per step
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status._finished  # `RequestStatus.finished` without a second property call

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end) of prompt + output."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """Decide, after a token was appended, whether the request is done (stop token, EOS or length).
        A speculative step appends its accepted tokens one at a time and calls this after each, so a stop
        inside an accepted run ends the request there (`Scheduler.resolve`)."""
        num_output = len(self.output_token_ids)  # read once: this runs for every request at every step
        if not num_output:
            return None
        last = self.output_token_ids[-1]
        params = self.sampling_params
        if num_output >= params.min_tokens:
            if not params.ignore_eos and last in self.eos_token_ids:
                self.stop_reason = None
                return RequestStatus.FINISHED_STOPPED
            if last in params.stop_token_ids:
                self.stop_reason = last
                return RequestStatus.FINISHED_STOPPED
        if num_output >= self.max_tokens or len(self.prompt_token_ids) + num_output >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
