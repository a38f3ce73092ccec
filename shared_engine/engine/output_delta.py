"""Cumulative `RequestOutput`s as per-step deltas, for sending them between processes.

The engine core builds cumulative outputs (each carries the whole text, every output token id, and the
prompt token ids). Pickled as they are, a step of 64 RAG requests would ship ~64 x 6,000 prompt ids to
the API process on every step. `OutputDeltaEncoder` (engine core side) sends only what changed since the
request's last output; `OutputDeltaDecoder` (API side) rebuilds the same cumulative `RequestOutput` from
the prompt it already holds and the deltas. Text is sent as (characters kept, characters added), so a
text that shrinks (a stop string trimmed when the request finishes) round-trips exactly.

Encoded forms are tuples of plain Python values (cheap to pickle):
    output:     (request_id, finished, metrics, num_cached_tokens, prompt_logprobs | None, extra | None,
                 [choice, ...])
    choice:     (index, keep_chars, added_text, num_old_tokens, new_token_ids, num_old_logprobs,
                 new_logprobs | None, cumulative_logprob, finish_reason, stop_reason, stream_safe_len)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared_engine.outputs import CompletionOutput, RequestOutput


def _common_prefix_len(a: str, b: str) -> int:
    if b.startswith(a):
        return len(a)  # the usual case: text only grows
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _Sent:
    """What the decoder already holds for one choice."""

    text: str = ""
    num_tokens: int = 0
    num_logprobs: int = 0


@dataclass
class _SentRequest:
    choices: dict[int, _Sent] = field(default_factory=dict)
    prompt_logprobs_count: int = -1


class OutputDeltaEncoder:
    """Engine core side: one per connection; forgets a request once its finished output is encoded."""

    def __init__(self) -> None:
        self._sent: dict[str, _SentRequest] = {}

    def encode(self, out: RequestOutput) -> tuple:
        state = self._sent.setdefault(out.request_id, _SentRequest())
        choices = []
        for c in out.outputs:
            sent = state.choices.setdefault(c.index, _Sent())
            keep = _common_prefix_len(sent.text, c.text)
            old_tokens = sent.num_tokens if len(c.token_ids) >= sent.num_tokens else 0
            logprobs = c.logprobs or []
            old_lp = sent.num_logprobs if len(logprobs) >= sent.num_logprobs else 0
            choices.append((c.index, keep, c.text[keep:], old_tokens, list(c.token_ids[old_tokens:]), old_lp,
                            list(logprobs[old_lp:]) if c.logprobs is not None else None, c.cumulative_logprob,
                            c.finish_reason, c.stop_reason, c.stream_safe_len))
            sent.text, sent.num_tokens, sent.num_logprobs = c.text, len(c.token_ids), len(logprobs)
        prompt_logprobs = None
        if out.prompt_logprobs is not None:
            count = sum(v is not None for v in out.prompt_logprobs)
            if count != state.prompt_logprobs_count:
                prompt_logprobs, state.prompt_logprobs_count = out.prompt_logprobs, count
        if out.finished:
            del self._sent[out.request_id]
        return (out.request_id, out.finished, out.metrics, out.num_cached_tokens, prompt_logprobs,
                out.extra or None, choices)

    def forget(self, request_id: str) -> None:
        self._sent.pop(request_id, None)


@dataclass
class _Held:
    prompt: str | None
    prompt_token_ids: list[int]
    choices: dict[int, CompletionOutput] = field(default_factory=dict)
    prompt_logprobs: list | None = None


class OutputDeltaDecoder:
    """API side: `register` each request when it is sent, `decode` each delta into a new cumulative
    `RequestOutput` (new objects every time: consumers may keep earlier outputs), `forget` on abort.

    Raises:
        KeyError: `decode` of a request that was never registered (or already finished/forgotten).
    """

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def register(self, request_id: str, prompt: str | None, prompt_token_ids: list[int]) -> None:
        self._held[request_id] = _Held(prompt, prompt_token_ids)

    def forget(self, request_id: str) -> None:
        self._held.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def decode(self, delta: tuple) -> RequestOutput:
        request_id, finished, metrics, num_cached, prompt_logprobs, extra, choices = delta
        held = self._held[request_id]
        if prompt_logprobs is not None:
            held.prompt_logprobs = prompt_logprobs
        outputs = []
        for (index, keep, added, old_tokens, new_tokens, old_lp, new_lp, cumulative, finish, stop,
             safe_len) in choices:
            prev = held.choices.get(index)
            text = (prev.text[:keep] if prev else "") + added
            token_ids = (prev.token_ids[:old_tokens] if prev else []) + new_tokens
            logprobs = None
            if new_lp is not None:
                logprobs = ((prev.logprobs or [])[:old_lp] if prev else []) + new_lp
            choice = CompletionOutput(index=index, text=text, token_ids=token_ids, cumulative_logprob=cumulative,
                                      logprobs=logprobs, finish_reason=finish, stop_reason=stop,
                                      stream_safe_len=safe_len)
            held.choices[index] = choice
            outputs.append(choice)
        if finished:
            del self._held[request_id]
        return RequestOutput(request_id=request_id, prompt=held.prompt, prompt_token_ids=held.prompt_token_ids,
                             outputs=outputs, finished=finished, metrics=metrics, num_cached_tokens=num_cached,
                             prompt_logprobs=held.prompt_logprobs, extra=extra or {})
