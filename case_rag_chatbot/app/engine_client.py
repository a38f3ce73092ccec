"""`EngineClient`: streams one chat completion from the engine's OpenAI API (`POST {ENGINE_URL}/chat/completions`).

It sends `stream: true` with `stream_options.include_usage`, and turns the SSE frames into `TextDelta`s
and one final `Finished` (finish reason and usage; usage carries `prompt_tokens_details.cached_tokens`,
the prefix-cache hit of this request). Closing the generator closes the HTTP stream, which makes the
engine abort the request and free its KV blocks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx


class EngineError(Exception):
    """The engine answered with an error (HTTP status, or an error frame inside the stream)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finished:
    finish_reason: str | None
    usage: dict = field(default_factory=dict)


class EngineClient:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        # httpx's default pool (100 connections, 20 kept alive), with idle connections closed before the
        # engine's 5 s keep-alive timeout, so a request is never sent on a connection the server is closing
        # (httpx's default expiry is the same 5 s: a POST would fail).
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers,
                                      timeout=httpx.Timeout(timeout_s, connect=10.0),
                                      limits=httpx.Limits(max_connections=100, max_keepalive_connections=20,
                                                          keepalive_expiry=3.0))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def stream_chat(self, messages: list[dict], max_tokens: int, temperature: float = 0.0,
                          repetition_penalty: float | None = None) -> AsyncIterator[TextDelta | Finished]:
        """Deltas of the answer's text as the engine sends them, then one `Finished`.

        Raises:
            EngineError: a non-200 answer, an error frame, or a stream that ends without `[DONE]`.
            httpx.HTTPError: the engine could not be reached.
        """
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        if repetition_penalty is not None and repetition_penalty != 1.0:
            body["repetition_penalty"] = repetition_penalty
        finish_reason, usage = None, {}
        async with self.http.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise EngineError(_error_message(await response.aread()), response.status_code)
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    yield Finished(finish_reason, usage)
                    return
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise EngineError(chunk["error"].get("message", "engine error"))
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    finish_reason = choice.get("finish_reason") or finish_reason
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield TextDelta(text)
        raise EngineError("the engine's stream ended without [DONE]")


def _error_message(body: bytes) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:500] or "engine error"
