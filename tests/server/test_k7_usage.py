"""K7 (handed.md H15): usage accounting, streamed (one extra usage chunk) and not."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("n", [1, 2])
def test_h15_stream_usage_chunk(server, n):
    body = {"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": 7,
            "n": n, "temperature": 0.8, "seed": 3, "ignore_eos": True}
    frames = server.stream("/v1/chat/completions", {**body, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    usage_frames = [f for f in frames if f["usage"] is not None]
    assert len(usage_frames) == 1 and frames[-1] is usage_frames[0] and frames[-1]["choices"] == []
    assert all(f["usage"] is None and f["choices"] for f in frames[:-1])
    usage = frames[-1]["usage"]
    assert usage["completion_tokens"] == 7 * n
    assert usage["prompt_tokens_details"] == {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}
    full = server.post("/v1/chat/completions", body).json()["usage"]
    assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {k: full[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7 * n
    without = server.stream("/v1/chat/completions", {**body, "stream": True})
    assert all(f["usage"] is None for f in without)
