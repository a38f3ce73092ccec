"""K1 (handed.md H01-H03): stop strings matched on decoded text across token boundaries, possible partial
matches held back and flushed on every finish, the stop text never returned."""

from __future__ import annotations

import pytest
from sse_helpers import finish_reasons, joined_text

ALPHABET = "Here is the English alphabet: ABC"


def _assert_prefix_safe(frames, final: str, chat: bool = False) -> None:
    """Every delta extends a prefix of the final text: nothing sent is later taken back."""
    sent = ""
    for f in frames:
        for c in f["choices"]:
            sent += (c["delta"].get("content") or "") if chat else c["text"]
            assert final.startswith(sent), (sent, final)
    assert sent == final


def test_h01_stop_across_tokens_stream(server):
    body = {"prompt": ALPHABET, "stop": ["DEFGHIJ"], "max_tokens": 20, "temperature": 0}
    full = server.post("/v1/completions", body).json()["choices"][0]
    frames = server.stream("/v1/completions", {**body, "stream": True})
    assert full["finish_reason"] == "stop" and "DEFGHIJ" not in full["text"]
    _assert_prefix_safe(frames, full["text"])
    assert finish_reasons(frames) == {0: "stop"}


# The whole kind: a stop in mid-text, one whose prefix appears and is released, one held at a length finish.
@pytest.mark.parametrize("stop", [["KLMNOP"], ["XYZ!"], ["Now, let's go"], ["QRS", "\n\n"]])
def test_k1_held_prefix_is_flushed_on_every_finish(server, stop):
    body = {"prompt": ALPHABET, "stop": stop, "max_tokens": 20, "temperature": 0}
    full = server.post("/v1/completions", body).json()["choices"][0]
    frames = server.stream("/v1/completions", {**body, "stream": True})
    _assert_prefix_safe(frames, full["text"])
    assert finish_reasons(frames)[0] == full["finish_reason"]
    assert not any(s in full["text"] for s in stop)
    unstopped = server.post("/v1/completions", {**body, "stop": None}).json()["choices"][0]["text"]
    if full["finish_reason"] == "length":
        assert full["text"] == unstopped  # the held tail was flushed
    else:
        assert unstopped.startswith(full["text"]) and full["text"] != unstopped


def test_h02_newline_stop_seeded(server):
    body = {"prompt": "Alice: Ask me any question.\nBob: What color is the sky on Mars", "stop": ["\n"],
            "seed": 42, "max_tokens": 8}
    full = server.post("/v1/completions", body).json()["choices"][0]
    frames = server.stream("/v1/completions", {**body, "stream": True})
    assert joined_text(frames)[0] == full["text"] and "\n" not in full["text"]
    assert finish_reasons(frames)[0] == full["finish_reason"]


# The row's own input, and one the default model really answers with a "7" (checked when written).
@pytest.mark.parametrize("user", ["Say number 1 - 10", "Count from 1 to 10, separated by commas."])
def test_h03_chat_stop_and_no_template_fragments(server, user):
    messages = [{"role": "system", "content": "You are instruction follower."},
                {"role": "user", "content": user}]
    body = {"messages": messages, "temperature": 0, "max_tokens": 60}
    plain = server.post("/v1/chat/completions", body).json()["choices"][0]
    if user.startswith("Count"):
        assert "7" in plain["message"]["content"], plain
    stopped = server.post("/v1/chat/completions", {**body, "stop": ["7"]}).json()["choices"][0]
    content = stopped["message"]["content"]
    assert "7" not in content and plain["message"]["content"].startswith(content)
    if "7" in plain["message"]["content"]:
        assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == "7"
        assert content == plain["message"]["content"].split("7")[0]
    for extra in ({}, {"stop": ["7"]}):
        frames = server.stream("/v1/chat/completions", {**body, **extra, "stream": True})
        deltas = [c["delta"].get("content") or "" for f in frames for c in f["choices"]]
        assert not any("<|" in d or "im_end" in d or "im_start" in d for d in deltas)
        expected = content if extra else plain["message"]["content"]
        _assert_prefix_safe(frames, expected, chat=True)
