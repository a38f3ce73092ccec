"""The chat messages sent to the engine for one question: a pure function of its inputs.

Order decides prefix reuse. The engine's prefix cache shares a KV block only when every token before it,
and in it, is identical to a cached request's (block hashes are chained from the first token). With the
fixed system prompt first (`context_first=False`, the fix), every request starts with the same ~4k tokens
and only the retrieved excerpts and the question are computed anew. With the retrieved excerpts first
(`context_first=True`, the first attempt), requests differ from their first few tokens on, and the whole
system prompt is prefilled again for every question.
"""

from __future__ import annotations

from collections.abc import Sequence

CONTEXT_HEADER = "Documentation excerpts for this question (cite them by number):"


def format_excerpt(number: int, title: str, source: str, text: str) -> str:
    """One numbered excerpt as the model sees it: `[n] title (source)` then the chunk's text."""
    body = text.split("\n\n", 1)[1] if text.startswith(title + "\n\n") else text
    return f"[{number}] {title} ({source})\n{body.strip()}"


def build_messages(system_prompt: str, chunks: Sequence[str], question: str,
                   context_first: bool = False) -> list[dict[str, str]]:
    """Chat messages for one turn: one system message holding the policy and the excerpts, then the question.

    `chunks` are the retrieved excerpts, already formatted (`format_excerpt`). `context_first=False` (the
    fix): the system prompt, then the excerpts. `context_first=True` (the first attempt): the excerpts
    before the system prompt.
    """
    context = "\n\n".join([CONTEXT_HEADER, *chunks]) if chunks else ""
    parts = [context, system_prompt] if context_first else [system_prompt, context]
    system = "\n\n".join(p for p in parts if p)
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]
