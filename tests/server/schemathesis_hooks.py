"""schemathesis hooks (loaded through SCHEMATHESIS_HOOKS) that keep fuzzed generations short on the CPU:
`max_tokens` above 2 (or null) becomes 2 and `n` above 1 becomes 1, so that 50+ examples per operation
finish in a few minutes. Everything else the schema allows is sent as generated."""

from __future__ import annotations

import schemathesis

_CAPS = {"max_tokens": 2, "max_completion_tokens": 2, "n": 1}


@schemathesis.hook
def map_body(context, body):
    if isinstance(body, dict):
        for name, cap in _CAPS.items():
            value = body.get(name)
            too_big = isinstance(value, int) and not isinstance(value, bool) and value > cap
            unbounded = value is None and name in body and name != "n"
            if too_big or unbounded:
                body[name] = cap
    return body
