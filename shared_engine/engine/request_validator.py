"""Checks a request before it reaches the scheduler; every failure is a `ValueError` with a clear message."""

from __future__ import annotations

from shared_engine.sampling_params import SamplingParams


def validate_request(prompt_token_ids: list[int], params: SamplingParams, max_model_len: int,
                     max_logprobs: int, vocab_size: int) -> int:
    """Validate and return the resolved `max_tokens` (None → up to the context limit).

    Raises:
        ValueError: empty prompt, token ids (prompt, stop_token_ids, logit_bias) outside the vocabulary,
            sampling parameters out of range, or a prompt (+ max_tokens) over `max_model_len` (the message
            names all three numbers).
    """
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
    params.validate(max_logprobs)
    if not prompt_token_ids:
        raise ValueError("the prompt is empty: give at least one token")
    if any(not isinstance(t, int) or t < 0 or t >= vocab_size for t in prompt_token_ids):
        raise ValueError(f"prompt token ids must be integers in [0, {vocab_size})")
    for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or ())):
        if any(t >= vocab_size for t in ids):
            raise ValueError(f"{name}: token ids must be in [0, {vocab_size})")
    message = context_overflow(len(prompt_token_ids), params.max_tokens, max_model_len)
    if message is not None:
        raise ValueError(message)
    return max_model_len - len(prompt_token_ids) if params.max_tokens is None else params.max_tokens


def context_overflow(n: int, max_tokens: int | None, max_model_len: int) -> str | None:
    """The context-overflow message for a prompt of `n` tokens and `max_tokens` (None: at least one
    output token must fit), or None when it fits."""
    if max_tokens is None:
        if n >= max_model_len:
            return (f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                    f"{n} tokens, which leaves no room for any output token.")
        return None
    if n + max_tokens > max_model_len:
        return (f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the completion "
                f"(max_tokens)). Please reduce the prompt or max_tokens.")
    return None
