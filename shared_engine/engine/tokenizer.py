"""Tokenizer loading and chat templates (Hugging Face tokenizers; we write none of our own)."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: Path | None):
    """A `transformers` fast tokenizer from a local directory, or None when there is none (token-id
    prompts only, e.g. a dummy-weight model from a shape preset)."""
    if path is None or not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def apply_chat_template(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                        tools: list[dict] | None = None) -> list[int]:
    """Render `messages` (and `tools`, for a template that reads them) with the tokenizer's own chat
    template and return the prompt token ids.

    Raises:
        ValueError: no tokenizer, a tokenizer without a chat template, or malformed messages.
    """
    text = render_chat_text(tokenizer, messages, add_generation_prompt, tools)
    return tokenizer.encode(text, add_special_tokens=False)


def render_chat_text(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                     tools: list[dict] | None = None) -> str:
    """The chat template's text for `messages` (encode it with `add_special_tokens=False`: the template
    already holds them). Many texts encode faster at once (`tokenizer(texts, add_special_tokens=False)`),
    as run-batch does. Raises `ValueError` as `apply_chat_template`."""
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer; this model was loaded without one")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} objects")
    extra = {} if tools is None else {"tools": tools}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **extra)
