"""The fixed system prompt: the assistant's operating policy in `system_prompt.md`, sized to a token budget.

The whole file is the brief's shared system prompt: 16,889 characters, 3,952 tokens with SmolLM2's
tokenizer (the embedded default model). Its sections are ordered by importance, so a smaller budget keeps
the first sections whole and drops the tail: `SYSTEM_PROMPT_TOKENS=1024` (the scaled-down CPU runs) keeps
the title and sections 1-3. Every request of one deployment gets the same text, which is what lets the
engine's prefix cache share it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

SYSTEM_PROMPT_FILE = Path(__file__).with_name("system_prompt.md")
# Characters per token of this file under SmolLM2's tokenizer (16,889 / 3,952); Llama 3's is similar.
CHARS_PER_TOKEN = 4.27


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def policy_sections(text: str) -> list[str]:
    """The title block, then one string per `## ` section, in file order."""
    return [section.strip() for section in re.split(r"\n(?=## )", text.strip())]


def load_system_prompt(max_tokens: int | None = None,
                       count_tokens: Callable[[str], int] = estimate_tokens,
                       path: Path = SYSTEM_PROMPT_FILE) -> str:
    """The policy text cut to whole sections that fit in `max_tokens` (None: the whole file).

    `count_tokens` counts a piece of text (default: the character-ratio estimate; pass a tokenizer's
    length for an exact budget). The title block is always kept.

    Raises:
        ValueError: `max_tokens` is smaller than the title block.
    """
    sections = policy_sections(path.read_text())
    if max_tokens is None:
        return "\n\n".join(sections)
    kept: list[str] = []
    for section in sections:
        candidate = "\n\n".join([*kept, section])
        if count_tokens(candidate) > max_tokens:
            break
        kept.append(section)
    if not kept:
        raise ValueError(f"system prompt budget {max_tokens} tokens is smaller than its title block")
    return "\n\n".join(kept)
