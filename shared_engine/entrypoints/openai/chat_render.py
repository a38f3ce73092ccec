"""Chat messages → prompt token ids, with the tokenizer's own chat template.

The `developer` role (OpenAI's newer name for instructions) is rendered as `system`; text content parts are
joined; any other part type (`image_url`, `input_audio`, `file`) is a 400 naming it, since this server
serves text models; assistant `tool_calls` and `tools` are rendered as tool_calls.py describes.
"""

from __future__ import annotations

from collections.abc import Callable

from shared_engine.engine.tokenizer import render_chat_text
from shared_engine.entrypoints.openai.errors import bad_request
from shared_engine.entrypoints.openai.protocol import ChatMessage
from shared_engine.entrypoints.openai.protocol_tools import Tool
from shared_engine.entrypoints.openai.tool_calls import with_tools

_ROLES = {"developer": "system"}
_KEPT_ROLES = ("system", "developer", "user", "assistant")  # the roles template_keeps_content probes


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """Messages as the chat template expects them. Raises `APIError` 400 for a non-text content part."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.type != "text":
                    raise bad_request(f"content parts of type `{part.type}` are not supported (this model reads "
                                      "text only)", f"messages.{i}.content.{j}.type")
            content = "".join(part.text or "" for part in content)
        message = {"role": _ROLES.get(m.role, m.role), "content": content or ""}
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def render_chat(tokenizer, messages: list[ChatMessage], add_generation_prompt: bool = True,
                tools: list[Tool] | None = None, check: Callable[[str], None] | None = None) -> list[int]:
    """Prompt token ids. `check` sees the rendered text before it is tokenised (and may raise).

    Raises:
        APIError: 400 when the template rejects the conversation, or whatever `check` raises.
    """
    dicts, template_tools = with_tools(message_dicts(messages), tools, [m.tool_calls for m in messages], tokenizer)
    try:
        text = render_chat_text(tokenizer, dicts, add_generation_prompt, tools=template_tools)
    except Exception as e:  # noqa: BLE001 - a template error comes from the client's messages
        raise bad_request(f"could not apply the chat template: {e}", "messages") from e
    if check is not None:
        check(text)
    try:
        return tokenizer.encode(text, add_special_tokens=False)
    except Exception as e:  # noqa: BLE001 - e.g. lone surrogates in the client's messages
        raise bad_request(f"could not tokenize the messages: {e}", "messages") from e


def template_keeps_content(tokenizer) -> bool:
    """True when the chat template renders every system, user and assistant message's content verbatim
    (probed once with marker texts): then the messages' text is a lower bound on the rendered text, and a
    conversation can be refused for its size before it is rendered (serving_chat.py)."""
    markers = [f"\u27e6probe{i}\u27e7" for i in range(4)]
    roles = ["system", "user", "assistant", "user"]
    try:
        text = render_chat_text(tokenizer, [{"role": r, "content": m} for r, m in zip(roles, markers, strict=True)])
    except Exception:  # noqa: BLE001 - no template, or one that refuses this conversation: no shortcut
        return False
    return all(text.count(m) == 1 for m in markers)


def content_text(messages: list[ChatMessage]) -> str:
    """The text of the system, developer, user and assistant messages' content, joined (what a template
    that keeps content renders verbatim, among other text)."""
    pieces = []
    for m in messages:
        if m.role in _KEPT_ROLES:
            if isinstance(m.content, str):
                pieces.append(m.content)
            elif isinstance(m.content, list):
                pieces.extend(part.text or "" for part in m.content if part.type == "text")
    return "".join(pieces)
