"""The abuse-shaped requests of reliability/abuse.py: each must get a 4xx with the OpenAI error envelope.

`CASES` maps a name to (path, request kwargs for `httpx.Client.request`). Requests whose abuse is in one
field carry `max_tokens: 1`, so that a server which wrongly accepts them still answers fast: what is
measured is the cost of refusing them, not of running them. Sizes are chosen against the server's
documented limits (README "Security"): the 8 MiB body cap, max_model_len 1,024 in the abuse run.
"""

from __future__ import annotations

import json

MODEL_FIELDS = {"max_tokens": 1}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _json(body) -> dict:
    return {"content": json.dumps(body).encode(), "headers": {"content-type": "application/json"}}


def _raw(text: str) -> dict:
    return {"content": text.encode(), "headers": {"content-type": "application/json"}}


def _user(content: str = "Hi") -> list[dict]:
    return [{"role": "user", "content": content}]


CASES: dict[str, tuple[str, dict]] = {
    # headers and bodies
    "header_64kb": (COMPLETIONS, {**_json({"prompt": "Hi", **MODEL_FIELDS}),
                                  "headers": {"content-type": "application/json", "x-big": "a" * 65536}}),
    "headers_5000": (COMPLETIONS, {**_json({"prompt": "Hi", **MODEL_FIELDS}),
                                   "headers": {"content-type": "application/json",
                                               **{f"x-h{i}": "v" for i in range(5000)}}}),
    "body_20mb": (COMPLETIONS, _json({"prompt": "a " * (10 * 1024 * 1024), **MODEL_FIELDS})),
    # malformed JSON and wrong types
    "malformed_json": (CHAT, _raw('{"messages": [{"role": "user", "content": "Hi"}], x}')),
    "body_array": (CHAT, _raw("[]")),
    "body_null": (CHAT, _raw("null")),
    "body_number": (CHAT, _raw("123")),
    "wrong_type_temperature": (CHAT, _json({"messages": _user(), "temperature": "hot", **MODEL_FIELDS})),
    "wrong_type_messages": (CHAT, _json({"messages": "Hi", **MODEL_FIELDS})),
    "wrong_type_prompt": (COMPLETIONS, _json({"prompt": {"text": "Hi"}, **MODEL_FIELDS})),
    "wrong_type_max_tokens": (COMPLETIONS, _json({"prompt": "Hi", "max_tokens": "many"})),
    "nan_temperature": (COMPLETIONS, _raw('{"prompt": "Hi", "max_tokens": 1, "temperature": NaN}')),
    "deep_nesting": (CHAT, _raw('{"messages": ' + "[" * 50000 + "]" * 50000 + "}")),
    # sizes and counts
    "huge_n": (COMPLETIONS, _json({"prompt": "Hi", "n": 10**6, **MODEL_FIELDS})),
    "huge_max_tokens": (COMPLETIONS, _json({"prompt": "Hi", "max_tokens": 10**12})),
    "huge_logprobs": (COMPLETIONS, _json({"prompt": "Hi", "logprobs": 10**6, **MODEL_FIELDS})),
    "huge_top_logprobs": (CHAT, _json({"messages": _user(), "logprobs": True, "top_logprobs": 10**6,
                                       **MODEL_FIELDS})),
    "huge_prompt_logprobs": (COMPLETIONS, _json({"prompt": "Hi", "prompt_logprobs": 10**6, **MODEL_FIELDS})),
    "many_stop_strings": (COMPLETIONS, _json({"prompt": "Hi", "stop": [f"s{i}" for i in range(100_000)],
                                             **MODEL_FIELDS})),
    "long_stop_string": (COMPLETIONS, _json({"prompt": "Hi", "stop": ["a" * 200_000], **MODEL_FIELDS})),
    "many_stop_token_ids": (COMPLETIONS, _json({"prompt": "Hi", "stop_token_ids": list(range(200_000)),
                                               **MODEL_FIELDS})),
    "many_prompts": (COMPLETIONS, _json({"prompt": ["Hi"] * 100_000, **MODEL_FIELDS})),
    "prompt_over_context": (COMPLETIONS, _json({"prompt": "word " * 1_500_000, **MODEL_FIELDS})),
    "prompt_many_short_words": (COMPLETIONS, _json({"prompt": "ab " * 27_000, **MODEL_FIELDS})),
    "prompts_over_context": (COMPLETIONS, _json({"prompt": ["word " * 20_000] * 64, **MODEL_FIELDS})),
    "chat_message_over_context": (CHAT, _json({"messages": _user("word " * 1_500_000), **MODEL_FIELDS})),
    # chat templates that explode in size: many messages, each rendered with its own role markers
    "template_many_messages": (CHAT, _json({"messages": _user() * 200_000, **MODEL_FIELDS})),
    "template_many_parts": (CHAT, _json({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hi"}] * 200_000}], **MODEL_FIELDS})),
}


def raw_request(name: str, host: str = "127.0.0.1") -> bytes:
    """Case `name` as the bytes of one HTTP/1.1 request (`Connection: close`): sent from a socket, the
    client spends no Python on it (httpx takes seconds of CPU over 5,000 headers, which on a shared
    2-core machine would be measured as the server's cost)."""
    path, kwargs = CASES[name]
    body = kwargs.get("content", b"")
    headers = {"host": host, "connection": "close", **{k.lower(): v for k, v in kwargs.get("headers", {}).items()},
               "content-length": str(len(body))}
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode() + body


def is_envelope(body: bytes) -> bool:
    """True for `{"error": {"message", "type", "param", "code"}}`."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)
