"""Helpers for reading streamed (SSE) responses in the server tests."""

from __future__ import annotations


def joined_text(frames: list[dict], chat: bool = False) -> dict[int, str]:
    """Concatenated deltas per choice index."""
    out: dict[int, str] = {}
    for f in frames:
        for c in f["choices"]:
            piece = (c["delta"].get("content") or "") if chat else c["text"]
            out[c["index"]] = out.get(c["index"], "") + piece
    return out


def finish_reasons(frames: list[dict]) -> dict[int, str]:
    return {c["index"]: c["finish_reason"] for f in frames for c in f["choices"] if c["finish_reason"]}
