"""What the gateway changes in a request body before it reaches the engine, and what it reads from the answer.

`rewrite_body` pins everything that must come from the API key, never from the client: `model` (the tenant's
adapter: no request can reach another tenant's adapter or the base model), `cache_salt` (the tenant's: its
requests share prefix-cache blocks with each other and with no one else), `tenant` (the engine's fair-share
counter) and `priority`. It also asks a stream for its usage chunk (the token metrics need it) and fills in
`max_tokens` when the client named none (the token limit reserves it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .errors import GatewayError
from .tenants import Tenant

CHARS_PER_TOKEN = 4  # the prompt estimate's ratio; the engine's usage charges any excess afterwards


@dataclass(frozen=True)
class Rewritten:
    body: dict
    stream: bool
    client_wants_usage: bool  # False: the usage chunk the gateway asked for is not passed on
    reserved_tokens: int      # prompt estimate + max_tokens x n per prompt


def parse_body(raw: bytes) -> dict:
    """The JSON object in `raw`, or a 400 GatewayError."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GatewayError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the body must be a JSON object")
    return body


def _text_chars(value) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for k, v in value.items() if k in ("content", "text", "prompt"))
    return 0


def _is_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


def prompts_of(body: dict, chat: bool) -> list:
    """The request's prompts as the engine runs them: a chat is one; a completions `prompt` is a string, a
    list of token ids, or a list of either (one engine request each)."""
    if chat:
        return [body.get("messages")]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not _is_ids(prompt):
        return prompt
    return [prompt]


def estimate_prompt_tokens(body: dict, chat: bool) -> int:
    """Prompt tokens of all the request's prompts, estimated from characters (token ids counted exactly)."""
    total = 0
    for prompt in prompts_of(body, chat):
        if _is_ids(prompt):
            total += len(prompt)
        else:
            total += math.ceil(_text_chars(prompt) / CHARS_PER_TOKEN) + (
                8 * len(prompt) if chat and isinstance(prompt, list) else 0)
    return total


def rewrite_body(body: dict, tenant: Tenant, cache_salt: str, default_max_tokens: int, chat: bool) -> Rewritten:
    """The body the engine gets (see the module docstring). Raises GatewayError 400 for a bad `stream`,
    `stream_options`, `n` or `max_tokens`."""
    body = dict(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError(400, "stream must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise GatewayError(400, "stream_options must be an object", "stream_options")
    wants_usage = bool((options or {}).get("include_usage"))
    if stream:
        body["stream_options"] = {**(options or {}), "include_usage": True}
    field = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(field)
    if max_tokens is None:
        max_tokens = body[field] = default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise GatewayError(400, f"{field} must be a positive integer", field)
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GatewayError(400, "n must be a positive integer", "n")
    body.update(model=tenant.adapter, cache_salt=cache_salt, tenant=tenant.name, priority=tenant.priority)
    # every prompt of a completions request is an engine request generating up to max_tokens x n
    reserved = estimate_prompt_tokens(body, chat) + max_tokens * n * len(prompts_of(body, chat))
    return Rewritten(body, stream, wants_usage, reserved)


def used_tokens(usage: dict | None) -> int:
    if not usage:
        return 0
    return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
