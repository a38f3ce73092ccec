"""Checks on a request's raw JSON before FastAPI validates it into the pydantic models, and a faster
JSON parse.

Validating a body costs about 10 µs per chat message or content part on the event loop (200,000 messages:
2 s, during which no other request, stream or /health is served), and `json.loads` of a 7 MB body of
200,000 small objects about 0.5 s. `PrecheckedRoute` (the API's route class) parses the body with
pydantic-core's `from_json` (about 3x faster than `json.loads`; neither releases the GIL, so a thread would
not free the event loop) and runs `precheck` on the result: counts only, each O(1) or linear in the
(already bounded) number of items, on well-typed values only (a wrong type is left to validation's own
400). FastAPI then validates the parsed body it finds on the request (Starlette's `Request.json()` cache),
so it is parsed once. A body `from_json` refuses (a lone surrogate escape, nesting past 200 levels) is
left to FastAPI's own `json.loads` and error handling, unchecked here.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.routing import APIRoute
from pydantic_core import from_json
from starlette.requests import Request

from shared_engine.entrypoints.openai.errors import bad_request
from shared_engine.entrypoints.openai.request_limits import check_prompt_count, check_stop_limits
from shared_engine.entrypoints.openai.server_config import ServerConfig

BODY_BYTES_KEY = "shared_engine.body_bytes"  # scope key: the request body's size (middleware.py sets it)


def _check_messages(config: ServerConfig, messages) -> None:
    if not isinstance(messages, list):
        return
    if len(messages) > config.max_chat_messages:
        raise bad_request(f"messages: at most {config.max_chat_messages} messages are allowed, got {len(messages)}",
                          "messages")
    parts = sum(len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list))
    if parts > config.max_content_parts:
        raise bad_request(f"messages: at most {config.max_content_parts} content parts in all are allowed, "
                          f"got {parts}", "messages")


def precheck(path: str, data, config: ServerConfig) -> None:
    """Raises `APIError` 400 (naming the field) for counts past the server's limits in the raw body of
    `path`: chat messages and content parts, stop strings and ids, and completions prompts."""
    if not isinstance(data, dict):
        return
    stop, ids = data.get("stop"), data.get("stop_token_ids")
    if (stop is None or isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))) \
            and (ids is None or isinstance(ids, list)):
        check_stop_limits(config, stop, ids)
    if path.endswith("/chat/completions") or path == "/tokenize":
        _check_messages(config, data.get("messages"))
    prompt = data.get("prompt")
    if path.endswith("/completions") and isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        check_prompt_count(config, len(prompt))


class PrecheckedRoute(APIRoute):
    """An `APIRoute` whose JSON body is parsed with `from_json` and prechecked before validation. The app's
    `state.ctx` (a `ServingContext`) gives the server config."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def prechecked(request: Request):
            if request.method == "POST" and b"json" in dict(request.scope["headers"]).get(b"content-type", b"json"):
                body = await request.body()
                try:
                    data = from_json(body) if body else None
                except ValueError:
                    pass  # FastAPI parses it again and answers its own 400, or accepts what json.loads does
                else:
                    request._json = data  # Starlette's cache, which FastAPI's body parsing reads
                    precheck(request.url.path, data, request.app.state.ctx.server_config)
            return await handler(request)

        return prechecked
