"""`SchedulerOutput`: everything the model runner needs for one step, and nothing about how it was chosen."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared_engine.core.request import Request


@dataclass(slots=True)  # slots: one of these is built per request per step
class ScheduledRequest:
    """One request's share of a step: tokens at positions [start_position, start_position + len(token_ids)).

    `block_table` is the request's live block table (physical block ids, one per `block_size` tokens).
    `needs_sample` is True when this chunk reaches the end of the known tokens, so the step's last
    logits for this request produce its next token; a partial prefill chunk samples nothing.

    Speculative decoding: the last `num_draft_tokens` of `token_ids` are draft tokens (a proposer's guesses
    after the request's last verified token), so a speculative decode is `[last token, d_1 .. d_k]` at
    positions [num_tokens - 1, num_tokens + k). Its `num_draft_tokens + 1` last logits are verified in the
    step (`num_logits`): the step yields 1 to k + 1 tokens for the request, and the slots of rejected
    drafts are rewritten by a later step.
    """

    request: Request
    token_ids: list[int]
    start_position: int
    block_table: list[int]
    needs_sample: bool
    num_draft_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """KV length after this step (cached prefix + this chunk)."""
        return self.start_position + len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        """One query token after a cached context (the decode kernels' shape)."""
        return len(self.token_ids) == 1 and self.start_position > 0

    @property
    def is_spec_decode(self) -> bool:
        return self.num_draft_tokens > 0

    @property
    def draft_token_ids(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_draft_tokens:]

    @property
    def num_logits(self) -> int:
        """Rows of logits this request needs from the step: 0 (a partial prefill), 1, or k + 1."""
        return self.num_draft_tokens + 1 if self.needs_sample else 0


@dataclass
class SchedulerOutput:
    """The scheduler's decision for one step: decodes first, then speculative decodes, then prefill chunks.
    `num_batched_tokens` counts every scheduled token, draft tokens included (they spend the budget)."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    num_batched_tokens: int = 0
    num_draft_tokens: int = 0
    # multi-LoRA: the adapters (`Request.lora_key`) of every running request after this step's admissions;
    # the model runner keeps their GPU slots (at most `max_loras`). Empty when LoRA is off.
    running_loras: frozenset = frozenset()
    # KV offload (`--kv-offload-size`): copies the model runner runs before this step's forward, offloads
    # first: (gpu block, host slot) GPU -> host of blocks evicted this step, then (host slot, gpu block) host
    # -> GPU of prefix blocks found in the host tier (`BlockManager.take_copies`)
    kv_offloads: list[tuple[int, int]] = field(default_factory=list)
    kv_restores: list[tuple[int, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of decodes, speculative ones with their drafts (the rest are prompt tokens)."""
        return sum(1 for s in self.scheduled if s.is_decode) + sum(
            s.num_draft_tokens + 1 for s in self.scheduled if s.num_draft_tokens)

    @property
    def has_drafts(self) -> bool:
        return self.num_draft_tokens > 0

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_batched_tokens - self.num_decode_tokens
