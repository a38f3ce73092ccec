"""Per-request resource limits (`ServerConfig`'s `max_*` fields), checked before anything is tokenised
or queued. Each failure is an `APIError` 400 naming the field the client sent and the limit.

Why each exists: stop strings are matched and held back on every generated token of every sequence
(cost grows with their number and length); stop token ids are checked per token; each prompt of a
completions request is an engine request (a long list fills the waiting queue alone); the prompt tokens
of one request are prefill work that delays every other request's next token.
"""

from __future__ import annotations

from shared_engine.entrypoints.openai.errors import bad_request
from shared_engine.entrypoints.openai.server_config import ServerConfig


def check_stop_limits(config: ServerConfig, stop: str | list[str] | None, stop_token_ids: list[int] | None) -> None:
    """Raises `APIError` 400 (param `stop` or `stop_token_ids`) past the configured bounds."""
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > config.max_stop_strings:
        raise bad_request(f"stop: at most {config.max_stop_strings} stop strings are allowed, got {len(strings)}",
                          "stop")
    longest = max((len(s) for s in strings), default=0)
    if longest > config.max_stop_string_len:
        raise bad_request(f"stop: each stop string may have at most {config.max_stop_string_len} characters, "
                          f"got one of {longest}", "stop")
    count = len(stop_token_ids or [])
    if count > config.max_stop_token_ids:
        raise bad_request(f"stop_token_ids: at most {config.max_stop_token_ids} ids are allowed, got {count}",
                          "stop_token_ids")


def check_prompt_count(config: ServerConfig, count: int) -> None:
    """Raises `APIError` 400 (param `prompt`) for more prompts than `max_prompts_per_request`."""
    if count > config.max_prompts_per_request:
        raise bad_request(f"prompt: at most {config.max_prompts_per_request} prompts per request are allowed, "
                          f"got {count}", "prompt")


def check_prompt_tokens(config: ServerConfig, lengths: list[int], n: int, param: str) -> None:
    """Raises `APIError` 400 when the prompts' tokens times `n` exceed `max_prompt_tokens_per_request`."""
    total = sum(lengths) * n
    if total > config.max_prompt_tokens_per_request:
        raise bad_request(f"{param}: the request's prompts have {sum(lengths)} tokens in all (x n={n}: {total}), "
                          f"more than the {config.max_prompt_tokens_per_request} allowed per request", param)
