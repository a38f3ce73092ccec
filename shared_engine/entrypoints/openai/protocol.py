"""Request and response bodies of the OpenAI-compatible API (pydantic; they also make `/openapi.json`).

Field names, types and ranges follow OpenAI's API and vLLM's extensions (`top_k`, `min_p`,
`repetition_penalty`, `stop_token_ids`, `ignore_eos`, `min_tokens`, `cache_salt`, `prompt_logprobs`,
`request_id`, `include_stop_str_in_output`, `skip_special_tokens`, `priority`) and ours (`tenant`).
Range checks here become 400s before anything reaches the engine; limits that depend on the server's configuration (`n`,
`top_logprobs`, the context length) are checked by the handlers. A field this server does not know is a
400 naming it (`extra="forbid"`): nothing a client sends is silently dropped.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared_engine.entrypoints.openai.protocol_tools import (
    DeltaToolCall,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoice,
)

# Seeds are 64-bit (torch generators); other integers are bounded so that no value reaches the engine
# that it cannot hold.
_INT64 = 2**63 - 1
TokenIds = list[Annotated[int, Field(ge=0, le=_INT64)]]


def _check_text(value: Any) -> None:
    """Reject strings that cannot be encoded as UTF-8 (lone surrogates from `\\ud800` escapes)."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, list):
        for item in value:
            _check_text(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        try:
            _check_text(data)
        except UnicodeEncodeError as e:
            raise ValueError("strings must be valid UTF-8 (no lone surrogates)") from e
        return data


class StreamOptions(OpenAIModel):
    include_usage: bool | None = False


class SamplingFields(OpenAIModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=_INT64)
    min_p: float | None = Field(None, ge=0, le=1)
    n: int = Field(1, ge=1, le=_INT64)
    seed: int | None = Field(None, ge=-(2**63), le=_INT64)
    stop: str | list[str] | None = None
    stop_token_ids: TokenIds | None = None
    presence_penalty: float | None = Field(0.0, ge=-2, le=2)
    frequency_penalty: float | None = Field(0.0, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=_INT64)
    user: str | None = None
    # token id (as a string, OpenAI's shape) → bias in [-100, 100]; bounded: each entry costs every step
    logit_bias: dict[str, float] | None = Field(None, max_length=1024)
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    prompt_logprobs: int | None = Field(None, ge=0, le=_INT64)
    request_id: str | None = Field(None, min_length=1, max_length=256)
    # scheduling policy inputs: lower `priority` first (--scheduling-policy priority; vLLM's field) and the
    # `tenant` whose fair-share counter the request charges (--scheduling-policy fair)
    priority: int = Field(0, ge=-(2**31), lt=2**31)
    tenant: str | None = Field(None, min_length=1, max_length=256)
    # the agent session this turn belongs to (else the `X-Session-Id` header): --session-pin-ttl pins its prefix
    session_id: str | None = Field(None, min_length=1, max_length=256)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(16, ge=0, le=_INT64)  # 0 only with echo (prompt scoring)
    logprobs: int | None = Field(None, ge=0, le=_INT64)
    echo: bool | None = False
    best_of: int | None = Field(None, ge=1, le=_INT64)  # accepted only when it equals n (no server-side ranking)
    suffix: str | None = None  # accepted only when null or "" (no insertion mode)


class ContentPart(OpenAIModel):
    """Only text parts are served; the chat handler answers other types (`image_url`, ...) with a 400
    naming the part, so their fields are let through to that check."""

    model_config = ConfigDict(extra="allow")
    type: str = "text"
    text: str | None = None


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=_INT64)
    max_completion_tokens: int | None = Field(None, ge=1, le=_INT64)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=_INT64)
    add_generation_prompt: bool = True
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: TokenIds


# ---- responses ----------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's shape of one prompt_logprobs entry (keyed by the token id as a string)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "shared-engine"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    vocab_size: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str
    engine_config: dict[str, Any] = Field(default_factory=dict)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
