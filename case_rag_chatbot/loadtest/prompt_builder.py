"""The prompt order, read from the app's prompt builder so the load test lays prompts out as the app does.

The measured runs send token-id prompts (exact lengths, any model, dummy weights included), so they cannot
call the app's text builder directly. Instead `segment_order` calls the builder once with marker strings
and reads back where the system prompt, the retrieved context and the question ended up; `run_case.py`
then concatenates token-id segments in that order. If the app's builder is importable it is the one used;
otherwise the local `build_messages` below (same signature) stands in.
"""

from __future__ import annotations

import sys
from pathlib import Path

CASE_DIR = Path(__file__).resolve().parents[1]
SEGMENTS = ("system", "context", "question")
_MARKERS = {"system": "\x02SYSTEM\x03", "context": "\x02CONTEXT\x03", "question": "\x02QUESTION\x03"}


def build_messages(system_prompt: str, chunks: list[str], question: str, context_first: bool = False) -> list[dict]:
    """Chat messages for one turn. `context_first=False` (the fix): the fixed system prompt first, so every
    request starts with the same tokens; True (the first attempt): the retrieved text first."""
    context = "\n\n".join(chunks)
    system = f"{context}\n\n{system_prompt}" if context_first else f"{system_prompt}\n\n{context}"
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def app_builder():
    """The app's builder (`app.prompt.build_messages`) when the app package is importable, else ours."""
    if str(CASE_DIR) not in sys.path:
        sys.path.insert(0, str(CASE_DIR))
    try:
        from app.prompt import build_messages as builder  # noqa: PLC0415
    except ImportError:
        return build_messages
    return builder


def builder_name(builder=None) -> str:
    builder = builder or app_builder()
    return f"{builder.__module__}.{builder.__qualname__}"


def segment_order(context_first: bool, builder=None) -> tuple[str, ...]:
    """The order ("system", "context", "question") in which `builder` places the three parts."""
    builder = builder or app_builder()
    messages = builder(_MARKERS["system"], [_MARKERS["context"]], _MARKERS["question"], context_first=context_first)
    text = "\n".join(str(m.get("content", "")) for m in messages)
    positions = {name: text.find(marker) for name, marker in _MARKERS.items()}
    missing = [name for name, pos in positions.items() if pos < 0]
    if missing:
        raise ValueError(f"the prompt builder dropped {missing}; cannot read its order")
    return tuple(sorted(SEGMENTS, key=positions.__getitem__))
