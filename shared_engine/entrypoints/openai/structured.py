"""`response_format` and `tool_choice` → the engine's `StructuredOutputsParams` (a JSON schema).

`json_object` is any JSON object; `json_schema` its `schema` (OpenAI's `strict` is always honoured: the
grammar admits only matching text). `tool_choice: "required"` constrains the output to a JSON array of
calls `[{"name": <one of the tools>, "arguments": <its parameters>}]` (one call at most when
`parallel_tool_calls` is false) and a named function to that function's arguments, as vLLM does.
"""

from __future__ import annotations

from shared_engine.entrypoints.openai.errors import bad_request
from shared_engine.entrypoints.openai.protocol import ChatCompletionRequest
from shared_engine.entrypoints.openai.protocol_tools import NamedToolChoice, Tool
from shared_engine.sampling_params import StructuredOutputsParams

_ANY_OBJECT = {"type": "object"}


def tool_mode(req: ChatCompletionRequest) -> str | None:
    """None (no tools in play), "auto", "required" or "named". Raises `APIError` 400 for a choice that
    names no tool, or tools together with `response_format`."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if choice == "none":
        return None
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request("response_format cannot be combined with tools", "response_format")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in {t.function.name for t in req.tools}:
            raise bad_request(f"tool_choice names `{choice.function.name}`, which is not in tools",
                              "tool_choice")
        return "named"
    return "required" if choice == "required" else "auto"


def named_tool(req: ChatCompletionRequest) -> str | None:
    return req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else None


def structured_outputs(req: ChatCompletionRequest, mode: str | None) -> tuple[StructuredOutputsParams | None, str]:
    """The constraint for this request and the request field it comes from (for a 400's `param`)."""
    if mode == "named":
        tool = next(t for t in req.tools if t.function.name == named_tool(req))
        return StructuredOutputsParams(json=_parameters(tool)), "tools"
    if mode == "required":
        calls = {"type": "array", "minItems": 1, "items": {"anyOf": [_call_schema(t) for t in req.tools]}}
        if req.parallel_tool_calls is False:
            calls["maxItems"] = 1
        return StructuredOutputsParams(json=calls), "tools"
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None, "response_format"
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True), "response_format"
    if fmt.json_schema is None:
        raise bad_request("response_format of type json_schema needs json_schema", "response_format.json_schema")
    schema = fmt.json_schema.json_schema
    return StructuredOutputsParams(json=_ANY_OBJECT if schema is None else schema), "response_format.json_schema"


def _parameters(tool: Tool) -> dict:
    return tool.function.parameters or _ANY_OBJECT


def _call_schema(tool: Tool) -> dict:
    return {"type": "object", "properties": {"name": {"const": tool.function.name}, "arguments": _parameters(tool)},
            "required": ["name", "arguments"], "additionalProperties": False}
