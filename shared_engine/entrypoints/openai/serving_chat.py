"""`POST /v1/chat/completions`: messages rendered with the tokenizer's own chat template (system messages
as given, the generation prompt added), streamed or not."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shared_engine.engine.tokenizer import apply_chat_template
from shared_engine.entrypoints.openai.errors import APIError, bad_request, sse_error
from shared_engine.entrypoints.openai.generation_run import ClientDisconnected, GenerationRun, Job
from shared_engine.entrypoints.openai.logprobs import chat_logprobs
from shared_engine.entrypoints.openai.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    DeltaMessage,
    ResponseMessage,
)
from shared_engine.entrypoints.openai.request_limits import check_prompt_tokens
from shared_engine.entrypoints.openai.serving_base import ServingContext, event_stream, new_id, usage
from shared_engine.entrypoints.openai.streaming import DONE, ChoiceCursor, sse, visible_text
from shared_engine.outputs import CompletionOutput


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """Messages as the chat template expects them: text content parts joined, null content as ""."""
    out = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content if part.type == "text")
        out.append({"role": m.role, "content": content or ""})
    return out


def render_chat(tokenizer, messages: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
    """Prompt token ids. Raises `APIError` 400 when the template rejects the conversation."""
    try:
        return apply_chat_template(tokenizer, message_dicts(messages), add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - a template error comes from the client's messages
        raise bad_request(f"could not apply the chat template: {e}", "messages") from e


class ServingChat:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: ChatCompletionRequest, request: Request) -> Response:
        ctx = self.ctx
        ctx.check_model(req.model)
        k = self._top_logprobs(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = ctx.sampling_params(req, max_tokens, logprobs=k)
        ids = await ctx.off_loop(render_chat, ctx.need_tokenizer(), req.messages, req.add_generation_prompt)
        check_prompt_tokens(ctx.server_config, [len(ids)], req.n, "messages")
        run = GenerationRun(ctx.async_engine, ctx.metrics, new_id("chatcmpl"), [Job(ids, params)])
        run.start()
        if req.stream:
            return event_stream(self._stream(run, req, request))
        try:
            (out,) = await run.results(request)
        except ClientDisconnected:
            return Response(status_code=499)
        choices = [ChatChoice(index=c.index, message=ResponseMessage(content=visible_text(c)),
                              logprobs=self._logprobs(c, k, 0, len(c.token_ids)),
                              finish_reason=c.finish_reason, stop_reason=c.stop_reason) for c in out.outputs]
        body = ChatCompletionResponse(id=run.request_ids[0].rsplit("-", 1)[0], model=ctx.model_name,
                                      choices=choices, usage=usage([out]))
        return JSONResponse(body.model_dump(mode="json"))

    @staticmethod
    def _top_logprobs(req: ChatCompletionRequest) -> int | None:
        if not req.logprobs:
            if req.top_logprobs:
                raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return req.top_logprobs or 0

    def _logprobs(self, c: CompletionOutput, k: int | None, start: int, end: int) -> ChatLogprobs | None:
        if k is None or self.ctx.token_text is None:
            return None
        entries = (c.logprobs or [])[start:end]
        return ChatLogprobs(content=chat_logprobs(self.ctx.token_text, c.token_ids[start:end], entries, k))

    async def _stream(self, run: GenerationRun, req: ChatCompletionRequest, request: Request):
        ctx = self.ctx
        base_id, created = run.request_ids[0].rsplit("-", 1)[0], int(time.time())
        k = self._top_logprobs(req)

        def chunk(choices, usage_=None):
            return sse(ChatCompletionChunk(id=base_id, created=created, model=ctx.model_name, choices=choices,
                                           usage=usage_))

        yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                     for i in range(req.n)])
        cursors: dict[int, ChoiceCursor] = {}
        final = None
        async with run.abort_on_disconnect(request):
            try:
                async for _, out in run.outputs():
                    final = out
                    for c in out.outputs:
                        delta = cursors.setdefault(c.index, ChoiceCursor()).advance(c)
                        if delta is None:
                            continue
                        yield chunk([ChatChunkChoice(
                            index=c.index, delta=DeltaMessage(content=delta.text if delta.text else None),
                            logprobs=self._logprobs(c, k, delta.token_start, delta.token_end),
                            finish_reason=delta.finish_reason,
                            stop_reason=c.stop_reason if delta.finish_reason else None)])
            except ClientDisconnected:
                return
            except APIError as e:
                yield sse_error(e)
                yield DONE
                return
        if req.stream_options is not None and req.stream_options.include_usage and final is not None:
            yield chunk([], usage([final]))
        yield DONE
