"""K2 (handed.md H04): incremental detokenisation never emits half a UTF-8 character."""

from __future__ import annotations

import pytest
from sse_helpers import joined_text


@pytest.mark.parametrize("prompt", ["今天天气如何？", "Reply with three emoji"])
def test_h04_utf8_plain_stream_logprobs(server, tokenizer, prompt):
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 40}
    plain = server.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    frames = server.stream("/v1/chat/completions", {**body, "stream": True})
    streamed = joined_text(frames, chat=True)[0]
    for f in frames:  # no delta ends inside a character
        for c in f["choices"]:
            assert "\ufffd" not in (c["delta"].get("content") or "")
    with_lp = server.post("/v1/chat/completions", {**body, "logprobs": True, "top_logprobs": 2}).json()
    choice = with_lp["choices"][0]
    assert plain == streamed == choice["message"]["content"]
    assert "\ufffd" not in plain
    entries = choice["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) == 2 for e in entries)
    # The text is the tokenizer's own decode of the generated ids (their exact bytes are returned), less
    # a trailing incomplete character when a length finish cuts one.
    raw = b"".join(bytes(e["bytes"]) for e in entries)
    decoded = raw.decode("utf-8", errors="replace").replace("<|im_end|>", "")
    assert decoded.rstrip("\ufffd") == plain
    ids = tokenizer.encode(plain, add_special_tokens=False)
    assert tokenizer.decode(ids) == plain
    if prompt.startswith("今"):
        assert any(ord(ch) > 0x2E80 for ch in plain), plain  # really multi-byte output
