"""What the completions and chat handlers share: the served model name, request → `SamplingParams`,
request ids, cache salts, tokenisation off the event loop, usage, and the streaming response wrapper."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from shared_engine.entrypoints.openai.async_engine import AsyncEngineBase
from shared_engine.entrypoints.openai.chat_render import template_keeps_content
from shared_engine.entrypoints.openai.errors import APIError, bad_request
from shared_engine.entrypoints.openai.input_bounds import TokenBounds
from shared_engine.entrypoints.openai.logprobs import TokenText
from shared_engine.entrypoints.openai.metrics import ServerMetrics
from shared_engine.entrypoints.openai.preprocess_pool import PreprocessPool
from shared_engine.entrypoints.openai.protocol import PromptTokensDetails, SamplingFields, Usage
from shared_engine.entrypoints.openai.request_limits import check_stop_limits
from shared_engine.entrypoints.openai.server_config import ServerConfig
from shared_engine.entrypoints.openai.streaming import SSE_MEDIA_TYPE
from shared_engine.outputs import RequestOutput
from shared_engine.sampling.grammar import GrammarBackend
from shared_engine.sampling_params import SamplingParams, StructuredOutputsParams

# SamplingParams' messages start with the field's name: the 400's `param`
_FIELD = re.compile(r"^([a-z_]+)\b")

# Tokenisation and chat templating run in a pool, not on the event loop: a 7 MB prompt takes seconds to
# tokenise, and /health, streams and other requests must not wait for it. Hugging Face fast tokenizers
# release the GIL while encoding. Two workers for small inputs; large ones have a lane of their own
# (preprocess_pool.py).
TOKENIZER_WORKERS = 2


class ServingContext:
    def __init__(self, async_engine: AsyncEngineBase, metrics: ServerMetrics, model_name: str,
                 server_config: ServerConfig) -> None:
        self.async_engine = async_engine
        self.metrics = metrics
        self.model_name = model_name
        self.server_config = server_config
        self.tokenizer = async_engine.tokenizer
        self.token_text = TokenText(self.tokenizer) if self.tokenizer is not None else None
        vocab = async_engine.source.arch.vocab_size
        # the engine's EOS ids are not known here; the validation below does not depend on them
        self.grammar = GrammarBackend(self.tokenizer, vocab, ()) if self.tokenizer is not None else None
        self._salt_secret = (server_config.resolved_cache_salt_secret() or secrets.token_hex(32)).encode()
        self.pool = PreprocessPool(TOKENIZER_WORKERS, server_config.large_input_bytes, server_config.max_large_inputs)
        self.bounds = TokenBounds.from_tokenizer(self.tokenizer)
        self.template_keeps_content = self.tokenizer is not None and template_keeps_content(self.tokenizer)

    async def off_loop(self, fn: Callable, *args, size: int = 0):
        """`fn(*args)` in the pre-processing pool's lane for `size` bytes of input, awaited (exceptions
        propagate; 503 when the large lane is full)."""
        return await self.pool.run(fn, *args, size=size)

    async def encode(self, text: str, param: str = "prompt", add_special_tokens: bool = True,
                     size: int | None = None) -> list[int]:
        """`text`'s token ids, tokenised off the loop (in the lane for `size` bytes, default the text's
        length). Raises `APIError` 400 (`param`) when the text surely exceeds the context (input_bounds.py),
        before tokenising, or when the tokenizer rejects it."""
        tokenizer = self.need_tokenizer()
        self.bounds.check_context(text, self.max_model_len, param)

        def job() -> list[int]:
            self.bounds.check_context(text, self.max_model_len, param, full=True)
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

        try:
            return await self.off_loop(job, size=len(text) if size is None else size)
        except APIError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the tokenizer rejects is the client's input
            raise bad_request(f"could not tokenize the prompt: {e}", param) from e

    @property
    def max_model_len(self) -> int:
        return self.async_engine.max_model_len

    loras = None  # LoRARegistry when LoRA is enabled (api_server.create_app sets it)

    def check_model(self, model: str | None) -> None:
        self.resolve_model(model)

    def resolve_model(self, model: str | None):
        """The `LoRARequest` a request's `model` names, None for the base model (or no `model`).

        Raises:
            APIError: 404 for a name that is neither the base model nor a loaded adapter (never the base).
        """
        if model is None or model == self.model_name:
            return None
        lora = None if self.loras is None else self.loras.get(model)
        if lora is None:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        return lora

    def response_model(self, lora) -> str:
        """The response's `model`: the adapter's name for a request on an adapter (as vLLM answers), else
        the served model name."""
        return self.model_name if lora is None else lora.lora_name

    def need_tokenizer(self):
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer: send token ids")
        return self.tokenizer

    def base_id(self, prefix: str, req: SamplingFields) -> str:
        """The response id: `prefix-<request_id>` when the client gave one (vLLM's field), else a fresh
        uuid. The prefix keeps client ids apart from the ids the engine derives for `n` > 1 choices
        (`<index>_<id>`, which start with a digit); a duplicate of a running id is refused by the engine."""
        return f"{prefix}-{req.request_id}" if req.request_id else new_id(prefix)

    def cache_salt(self, req: SamplingFields, request) -> str | None:
        """The request's `cache_salt`; with `cache_salt_from_api_key`, an HMAC of the bearer token it
        presents (and of its own salt): another key can never hit this key's cached prefixes."""
        if not self.server_config.cache_salt_from_api_key:
            return req.cache_salt
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth[:7].lower() == "bearer " else auth
        message = key.encode() + b"\0" + (req.cache_salt or "").encode()
        return hmac.new(self._salt_secret, message, hashlib.sha256).hexdigest()

    @staticmethod
    def session_id(req: SamplingFields, request) -> str | None:
        """The body's `session_id`, else the `X-Session-Id` header (what nginx hashes for affinity).

        Raises:
            APIError: 400 for a header longer than 256 characters.
        """
        if req.session_id is not None:
            return req.session_id
        header = request.headers.get("x-session-id", "").strip()
        if len(header) > 256:
            raise bad_request(f"X-Session-Id must be at most 256 characters, got {len(header)}", "X-Session-Id")
        return header or None

    def check_structured(self, structured: StructuredOutputsParams | None, param: str) -> None:
        """Raises `APIError` 400 (with `param`) for a schema or grammar llguidance rejects."""
        if structured is None:
            return
        if self.grammar is None:
            raise bad_request("structured outputs need a tokenizer; this model has none", param)
        try:
            self.grammar.validate(structured)
        except ValueError as e:
            raise bad_request(f"{param}: {e}", param) from e

    def sampling_params(self, req: SamplingFields, max_tokens: int | None, logprobs: int | None = None,
                        prompt_logprobs: int | None = None,
                        structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
        """Raises `APIError` 400 for values the engine does not accept, naming the field."""
        return sampling_params_for(req, max_tokens, self.server_config, logprobs, prompt_logprobs, structured_outputs)


def sampling_params_for(req: SamplingFields, max_tokens: int | None, server_config: ServerConfig,
                        logprobs: int | None = None, prompt_logprobs: int | None = None,
                        structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
    """A request body's sampling fields as `SamplingParams` (also used by `run-batch`, without a server).

    Raises `APIError` 400 for `n` over `max_n`, stop lists past the server's limits, or values the engine
    does not accept (`param` names the field)."""
    if req.n > server_config.max_n:
        raise bad_request(f"n must be at most {server_config.max_n}, got {req.n}", "n")
    check_stop_limits(server_config, req.stop, req.stop_token_ids)
    try:
        bias = {int(k): v for k, v in (req.logit_bias or {}).items()}
    except ValueError as e:
        raise bad_request("logit_bias keys must be token ids (integers as strings)", "logit_bias") from e
    if prompt_logprobs is None or (req.prompt_logprobs is not None and req.prompt_logprobs > prompt_logprobs):
        prompt_logprobs = req.prompt_logprobs
    try:
        return SamplingParams(
            n=req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k,
            min_p=req.min_p or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            logit_bias=bias or None,
            structured_outputs=structured_outputs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
        )
    except ValueError as e:
        match = _FIELD.match(str(e))
        raise bad_request(str(e), match.group(1) if match and match.group(1) in type(req).model_fields
                          else None) from e


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(outputs: list[RequestOutput], count_generated: bool = True) -> Usage:
    """Prompt tokens once per prompt, completion tokens over all choices, cached prompt tokens."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs) if count_generated else 0
    cached = sum(o.num_cached_tokens for o in outputs)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def event_stream(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type=SSE_MEDIA_TYPE,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
