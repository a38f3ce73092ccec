"""schemathesis hooks (loaded through SCHEMATHESIS_HOOKS) that keep fuzzed generations short on the CPU:
every generation request asks for at most 2 tokens (also when `max_tokens` is missing or null, which
means "up to the context limit") and `n` is at most 1, so that 50+ examples per operation finish in a
few minutes. Everything else the schema allows is sent as generated."""

from __future__ import annotations

import schemathesis

MAX_TOKENS = 2


def _small(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value <= MAX_TOKENS


@schemathesis.hook
def map_body(context, body):
    if not isinstance(body, dict):
        return body
    if not _small(body.get("max_tokens")):
        body["max_tokens"] = MAX_TOKENS
    if "max_completion_tokens" in body and not _small(body["max_completion_tokens"]):
        body["max_completion_tokens"] = MAX_TOKENS
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        body["n"] = 1
    return body
