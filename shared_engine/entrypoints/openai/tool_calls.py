"""Tools in chat: rendering `tools` and assistant `tool_calls` into the prompt, and parsing the model's calls.

Format: Hermes / ChatML tool calling (NousResearch's Hermes 2 Pro, Qwen2.5, SmolLM3; vLLM's `hermes` parser):
tools are listed as JSON inside `<tools></tools>` in the system turn, and the model answers each call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. A chat template that renders `tools` (and
`tool_calls`) itself is given them (transformers' convention, arguments as objects); one that does not,
like SmolLM2-135M-Instruct's, gets the Hermes system block added to the first system message (or as one)
and earlier calls written into the assistant turns in the same tags, so the history is kept either way.

`tool_choice`: "none" renders no tools and parses nothing; "auto" renders them and parses calls out of the
text; "required" and a named function constrain the output with a JSON schema (structured.py), whose
output is the calls themselves (vLLM's approach), so the model cannot answer without calling.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from shared_engine.entrypoints.openai.protocol_tools import FunctionCall, Tool, ToolCall

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def template_renders(tokenizer, name: str) -> bool:
    """Whether the tokenizer's chat template reads `name` (`tools`, `tool_calls`)."""
    return name in (getattr(tokenizer, "chat_template", None) or "")


def system_block(tools: list[Tool]) -> str:
    """The Hermes system text that lists `tools` and the call format."""
    listed = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def call_text(call: ToolCall) -> str:
    return f"{TOOL_CALL_START}\n{json.dumps({'name': call.function.name, 'arguments': _arguments(call)})}\n" \
           f"{TOOL_CALL_END}"


def _arguments(call: ToolCall):
    try:
        return json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return call.function.arguments


def with_tools(messages: list[dict], tools: list[Tool] | None, tool_calls: list[list[ToolCall] | None],
               tokenizer) -> tuple[list[dict], list[dict] | None]:
    """Messages and the `tools=` argument for the chat template. `tool_calls[i]` are message i's calls."""
    native_calls = template_renders(tokenizer, "tool_calls")
    out = []
    for message, calls in zip(messages, tool_calls):
        message = dict(message)
        if calls and native_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.function.name, "arguments": _arguments(c)}}
                                     for c in calls]
        elif calls:
            message["content"] = "\n".join(filter(None, [message["content"], *map(call_text, calls)]))
        out.append(message)
    if not tools:
        return out, None
    if template_renders(tokenizer, "tools"):
        return out, [t.model_dump(exclude_none=True) for t in tools]
    block = system_block(tools)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out, None


def new_call(name: str, arguments) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id=f"chatcmpl-tool-{uuid.uuid4().hex}", function=FunctionCall(name=name, arguments=text))


@dataclass
class ParsedOutput:
    content: str | None
    tool_calls: list[ToolCall]


def parse_tool_calls(text: str, tools: list[Tool], parallel: bool = True) -> ParsedOutput:
    """Hermes calls in `text` (an unterminated last call counts when its JSON is complete). A call whose
    JSON does not parse, or that names no given tool, stays in the content; with `parallel` False
    (`parallel_tool_calls: false`) only the first call is kept and the text after it is dropped."""
    names = {t.function.name for t in tools}
    calls, kept, last = [], [], 0
    for match in _CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict) or body.get("name") not in names:
            continue
        calls.append(new_call(body["name"], body.get("arguments", body.get("parameters", {}))))
        kept.append(text[last:match.start()])
        last = match.end()
        if not parallel:
            last = len(text)
            break
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return ParsedOutput(content or None, calls)


def calls_from_json(text: str, named: str | None) -> list[ToolCall]:
    """Calls from a constrained output: the arguments of `named`, or (`required`) a JSON array of
    `{"name", "arguments"}`. Text that does not parse (cut by max_tokens) gives no calls."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return []
    if named is not None:
        return [new_call(named, body)]
    return [new_call(c["name"], c.get("arguments", {})) for c in body if isinstance(c, dict) and "name" in c]


def held_back(text: str) -> int:
    """How many characters of `text` a stream must not send yet in `auto` mode: from the first
    `<tool_call>`, or a tail that may still become one."""
    start = text.find(TOOL_CALL_START)
    if start >= 0:
        return len(text) - start
    for n in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-n:]):
            return n
    return 0
