"""`LLM`: the offline API (`from shared_engine import LLM, SamplingParams`), shaped like vLLM's."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from shared_engine.config import EngineConfig
from shared_engine.core.scheduling import check_scheduling_fields
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.engine.tokenizer import apply_chat_template
from shared_engine.lora.lora_request import LoRARequest
from shared_engine.outputs import RequestOutput
from shared_engine.sampling_params import SamplingParams

PromptType = str | list[int] | dict


class LLM:
    """Generate with our engine in-process.

    `LLM(model=None, **engine_args)`: `model` None is the embedded default (SmolLM2-135M-Instruct); every
    other keyword is an engine setting by its flat name (`max_num_seqs`, `block_size`, `kv_cache_memory`,
    `num_gpu_blocks_override`, `max_model_len`, `dtype`, `device`, `load_format`,
    `tensor_parallel_size`, ...).

    Raises:
        ValueError: an unknown setting or a value out of range (the message names it).
    """

    def __init__(self, model: str | None = None, *, benchmark_forced_acceptance: bool = False,
                 **engine_args) -> None:
        # benchmark_forced_acceptance: BENCHMARK ONLY (spec_decode/forced_acceptance.py), not an engine setting
        self.engine = LLMEngine(EngineConfig.from_flat(model=model, **engine_args),
                                benchmark_forced_acceptance=benchmark_forced_acceptance)
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        """An `LLM` on an already built `EngineConfig` (e.g. from `cli_args.build_configs`)."""
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(config)
        llm._ids = itertools.count()
        return llm

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (`tensor_parallel_size` > 1); a no-op otherwise."""
        self.engine.shutdown()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: Sequence[int] | None = None,
        tenant: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in prompt order.

        `lora_request` (needs `enable_lora=True`): one adapter for every prompt, or one (or None, the base
        model) per prompt, as vLLM's. `priority` (one per prompt, lower first; vLLM's) and `tenant` (one
        for all or one per prompt) feed the `scheduling_policy` (priority / fair).

        A prompt is a string, a list of token ids, or `{"prompt_token_ids": [...]}` / `{"prompt": "..."}`
        (a dict may add `"cache_salt"`: requests share cached prefix blocks only under the same salt);
        a list of them is a batch. Raises `ValueError` for a bad prompt or parameters; nothing is queued
        then (all prompts are validated before any is added).
        """
        batch = _as_batch(prompts)
        params = _params_for(batch, sampling_params)
        encoded = [self._encode(p) for p in batch]
        salts = [p.get("cache_salt") if isinstance(p, dict) else None for p in batch]
        return self._run(encoded, params, use_tqdm, salts, _loras_for(batch, lora_request),
                         _scheduling_for(batch, priority, tenant))

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: Sequence[int] | None = None,
        tenant: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate
        (`lora_request`, `priority` and `tenant` as in `generate`)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        params = _params_for(conversations, sampling_params)
        tok = self.engine.tokenizer
        encoded = []
        for conv in conversations:
            ids = apply_chat_template(tok, conv, add_generation_prompt)
            encoded.append((tok.decode(ids), ids))
        return self._run(encoded, params, use_tqdm, None, _loras_for(conversations, lora_request),
                         _scheduling_for(conversations, priority, tenant))

    def _encode(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            tok = self.engine.tokenizer
            if tok is None:
                raise ValueError("this model has no tokenizer: pass token ids")
            return prompt, tok.encode(prompt) if prompt else []
        return None, list(prompt)

    def _run(self, encoded, params, use_tqdm: bool, salts=None, loras=None, scheduling=None) -> list[RequestOutput]:
        engine = self.engine
        loras = loras or [None] * len(encoded)
        scheduling = scheduling or [{}] * len(encoded)
        for (_, ids), p in zip(encoded, params):  # validate everything before queueing anything
            engine_check(engine, ids, p)
        for lora in {lora for lora in loras if lora is not None}:
            engine_check_lora(engine, lora)
        order = {}
        for (text, ids), p, salt, lora, sched in zip(encoded, params, salts or [None] * len(encoded), loras,
                                                     scheduling):
            request_id = str(next(self._ids))
            order[request_id] = len(order)
            engine.add_request(request_id, ids, p, prompt=text, cache_salt=salt, final_only=True, lora_request=lora,
                               **sched)
        results: list[RequestOutput | None] = [None] * len(order)
        bar = _progress(len(order), use_tqdm)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    results[order[output.request_id]] = output
                    bar.update(1) if bar else None
        if bar:
            bar.close()
        return results


def engine_check(engine: LLMEngine, ids: list[int], params: SamplingParams) -> None:
    from shared_engine.engine.request_validator import validate_request

    validate_request(ids, params, engine.max_model_len, engine.config.model.max_logprobs, engine.source.arch.vocab_size)


def engine_check_lora(engine: LLMEngine, lora: LoRARequest) -> None:
    """Raise `ValueError` (`LoRAValidationError`) for an adapter the engine could not load. The adapter is
    read into the engine's CPU cache (`LoRAManager.preload`), so the requests' `acquire` finds it there and
    a cached adapter is not read from disk again at every `generate`."""
    manager = getattr(engine.runner, "lora", None)
    if manager is None:
        raise ValueError(f"adapter {lora.lora_name!r} requested but LoRA is not enabled (enable_lora)")
    manager.preload(lora)


def _loras_for(batch: list, lora_request) -> list:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * len(batch)
    if len(lora_request) != len(batch):
        raise ValueError(f"got {len(lora_request)} lora_requests for {len(batch)} prompts")
    return list(lora_request)


def _scheduling_for(batch: list, priority, tenant) -> list[dict]:
    """Per prompt, the `add_request` keywords of the scheduling policy. Raises `ValueError` for a length
    mismatch."""
    if priority is None:
        priority = [0] * len(batch)
    elif len(priority) != len(batch):
        raise ValueError(f"got {len(priority)} priorities for {len(batch)} prompts")
    tenants = [tenant] * len(batch) if tenant is None or isinstance(tenant, str) else list(tenant)
    if len(tenants) != len(batch):
        raise ValueError(f"got {len(tenants)} tenants for {len(batch)} prompts")
    for p, t in zip(priority, tenants):
        check_scheduling_fields(p, t)
    return [{"priority": p, "tenant": t} for p, t in zip(priority, tenants)]


def _as_batch(prompts) -> list:
    if isinstance(prompts, str | dict):
        return [prompts]
    if prompts and isinstance(prompts[0], int):
        return [prompts]
    return list(prompts)


def _params_for(batch: list, params) -> list[SamplingParams]:
    if params is None:
        params = SamplingParams()
    if isinstance(params, SamplingParams):
        return [params] * len(batch)
    if len(params) != len(batch):
        raise ValueError(f"got {len(params)} sampling_params for {len(batch)} prompts")
    return list(params)


def _progress(total: int, enabled: bool):
    if not enabled or total < 2:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
