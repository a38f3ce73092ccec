"""Server-Sent Events framing and per-choice stream cursors.

A `ChoiceCursor` turns the engine's cumulative `CompletionOutput`s into deltas. While a choice runs it
sends only `stream_safe_len` characters (the detokenizer holds back a tail that may become a stop
string, and never ends on half a UTF-8 character); when the choice finishes, in any way, the rest is
flushed. Joined deltas therefore equal the final text, which is the non-streamed text.

`visible_text` drops a trailing incomplete UTF-8 character (U+FFFD from the detokenizer's flush when a
length finish cuts a multi-byte character): half a character is never sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring

from pydantic import BaseModel

from shared_engine.outputs import CompletionOutput

DONE = "data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream"


def sse(payload: BaseModel | dict) -> str:
    body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    return f"data: {json.dumps(body, ensure_ascii=False, allow_nan=False)}\n\n"


def _json(value: str | int | None) -> str:
    """`json.dumps(value, ensure_ascii=False)` for a str, an int or None, without the encoder's set-up."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring(value)
    return str(int(value))


class ChatContentChunks:
    """One stream's token chunks without the pydantic models: `content(...)` is exactly
    `sse(ChatCompletionChunk(id=.., created=.., model=.., choices=[ChatChunkChoice(index=.., delta=DeltaMessage(
    content=text), finish_reason=.., stop_reason=..)]))` (no role, tool calls or logprobs), at a fraction of
    the models' build and dump, for every token of every stream on the server's event loop
    (tests/server/test_chat_content_chunks.py)."""

    def __init__(self, chunk_id: str, created: int, model: str) -> None:
        head = json.dumps({"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model},
                          ensure_ascii=False)
        self._head = f'data: {head[:-1]}, "choices": [{{"index": '

    def content(self, index: int, text: str | None, finish_reason: str | None, stop_reason: int | str | None) -> str:
        return (f'{self._head}{index}, "delta": {{"role": null, "content": {_json(text)}, "tool_calls": null}}, '
                f'"logprobs": null, "finish_reason": {_json(finish_reason)}, "stop_reason": {_json(stop_reason)}}}], '
                '"usage": null}\n\n')


def visible_text(choice: CompletionOutput) -> str:
    if choice.finish_reason is not None and choice.text.endswith("\ufffd"):
        return choice.text.rstrip("\ufffd")
    return choice.text


@dataclass
class Delta:
    text: str
    token_start: int  # new tokens are token_ids[token_start:token_end]
    token_end: int
    finish_reason: str | None


class ChoiceCursor:
    def __init__(self) -> None:
        self.sent_chars = 0
        self.sent_tokens = 0
        self.finished = False

    def advance(self, choice: CompletionOutput) -> Delta | None:
        """The delta since the last call, or None when there is nothing new to send."""
        if self.finished:
            return None
        done = choice.finish_reason is not None
        full = visible_text(choice)
        limit = len(full)
        if not done and choice.stream_safe_len is not None:
            limit = min(limit, choice.stream_safe_len)
        text = full[self.sent_chars : limit] if limit > self.sent_chars else ""
        start, end = self.sent_tokens, len(choice.token_ids)
        if not text and not done:
            return None  # tokens without sendable text wait for the next delta (with their logprobs)
        self.sent_chars = max(self.sent_chars, limit)
        self.sent_tokens = end
        self.finished = done
        return Delta(text, start, end, choice.finish_reason)
