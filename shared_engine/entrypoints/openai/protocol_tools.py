"""Request and response bodies for structured output and tools: `response_format`, `tools`, `tool_choice`,
assistant `tool_calls` (OpenAI's shapes). Imported by protocol.py; the handling is in structured.py and
tool_calls.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names


class StrictModel(BaseModel):
    """Unknown fields are a 400 naming them (not silently dropped)."""

    model_config = ConfigDict(extra="forbid")


class JsonSchemaFormat(StrictModel):
    name: str = Field(pattern=_NAME)
    description: str | None = None
    # `schema` shadows a BaseModel attribute: held as `json_schema`, sent and received as "schema"
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDefinition(StrictModel):
    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(StrictModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    model_config = ConfigDict(extra="forbid")


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None
