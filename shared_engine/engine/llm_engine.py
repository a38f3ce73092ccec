"""`LLMEngine`: validates and admits requests, runs scheduler → model runner → scheduler steps, and turns
sampled tokens into `RequestOutput`s. Knows nothing about HTTP."""

from __future__ import annotations

import logging
import time
import weakref

from shared_engine.config import EngineConfig
from shared_engine.core.request import Request, RequestStatus
from shared_engine.core.scheduler import build_scheduler
from shared_engine.core.scheduling import check_scheduling_fields
from shared_engine.distributed.partition import head_partition
from shared_engine.distributed.tp_executor import make_model_runner
from shared_engine.engine.async_output import AsyncOutputStepper
from shared_engine.engine.kv_capacity import capacity_line, check_fits, num_kv_blocks
from shared_engine.engine.output_builder import OutputBuilder
from shared_engine.engine.request_validator import validate_request
from shared_engine.engine.spec_stats import SpecDecodeStats
from shared_engine.engine.stats import EngineStats
from shared_engine.engine.tokenizer import load_tokenizer
from shared_engine.model_executor.model_runner import StepResult
from shared_engine.model_loader.model_source import resolve_model
from shared_engine.outputs import RequestOutput
from shared_engine.sampling.grammar import GrammarBackend
from shared_engine.sampling_params import SamplingParams
from shared_engine.spec_decode.spec_decoder import SpecDecoder

logger = logging.getLogger("shared_engine")


class LLMEngine:
    def __init__(self, config: EngineConfig, *, benchmark_forced_acceptance: bool = False) -> None:
        """`benchmark_forced_acceptance` (BENCHMARK ONLY; no flag, config key or server route sets it): the
        replay proposer decides verification's outcome (`spec_decode/forced_acceptance.py`). Raises
        ValueError with it and no speculative config, or with tensor parallelism."""
        m = config.model
        self.source = resolve_model(m.model, m.load_format, m.tokenizer)
        arch = self.source.arch
        config = config.with_model_len(m.max_model_len or arch.max_position_embeddings).with_resolved_defaults()
        self._check_config(config)
        self.config = config
        self.max_model_len = config.model.max_model_len
        self.tokenizer = load_tokenizer(self.source.tokenizer_path)
        self.eos_token_ids = frozenset(self._eos_ids())
        self.grammar = (GrammarBackend(self.tokenizer, self.source.arch.vocab_size, self.eos_token_ids)
                        if self.tokenizer is not None else None)
        self.runner = make_model_runner(config, self.source, self.grammar)  # a TPExecutor when TP > 1
        spec = config.speculative_config
        # before the KV cache is sized: a draft model's weights are loaded and its cache shares the pool
        self.spec = None if spec is None else SpecDecoder(spec, self.max_model_len, engine_config=config,
                                                          source=self.source, runner=self.runner,
                                                          tokenizer=self.tokenizer)
        if benchmark_forced_acceptance:
            self._force_acceptance(config)
        num_blocks = self._num_kv_blocks(config)
        check_fits(num_blocks, config.cache.block_size, self.max_model_len)
        self.runner.allocate_kv_cache(num_blocks)
        self.runner.capture_cuda_graphs()
        if self.spec is not None:  # the policy prices speculative steps as the graphs pad them
            graphs = getattr(self.runner, "graph_runner", None)
            self.spec.set_step_padding(None if graphs is None else graphs.spec_step_padding())
        num_host_blocks = config.cache.num_host_blocks(self.runner.kv_bytes_per_block)  # as the runner counts
        self.scheduler = build_scheduler(config, num_blocks, self.max_model_len, num_host_blocks)
        self.block_manager = self.scheduler.block_manager
        self.outputs = OutputBuilder(self.tokenizer)
        self.stats = EngineStats()
        if self.spec is not None:
            self.spec.allocate_kv_cache(num_blocks)
            self.spec.bind(self.block_manager)
            self.stats.spec = SpecDecodeStats()
        s = config.scheduler
        self.async_outputs = (AsyncOutputStepper(overlap_scheduling=s.async_scheduling)
                              if s.enable_async_output_proc or s.async_scheduling else None)
        logger.info(capacity_line(num_blocks, config.cache.block_size, self.max_model_len))
        r = self.runner
        logger.info("Model %s loaded (%s%s, KV cache %s, %s). Cold start: weight loading %.1f s, compilation "
                    "(Triton JIT, profiling pass) %.1f s, CUDA graph capture %.1f s (%d graphs), total %.1f s",
                    self.source.name, r.dtype_name, ", fp8 linear layers" if config.model.quantization else "",
                    r.kv_dtype_name, r.device, r.load_seconds, r.compile_seconds, r.capture_seconds, r.num_cuda_graphs,
                    r.load_seconds + r.compile_seconds + r.capture_seconds)

    def _force_acceptance(self, config: EngineConfig) -> None:
        from shared_engine.spec_decode.forced_acceptance import ForcedAcceptance

        if self.spec is None:
            raise ValueError("benchmark_forced_acceptance needs a speculative_config (method 'replay')")
        if config.parallel.tensor_parallel_size > 1:
            raise ValueError("benchmark_forced_acceptance is not supported with tensor_parallel_size > 1")
        # a weak reference: `lambda: self.spec.proposer` made engine -> runner -> sampler -> engine a cycle, so a
        # dropped engine kept its weights and KV cache on the device until the garbage collector ran (the
        # next engine in the process then profiled that memory as used: 0 KV blocks, H200 9a99c62)
        engine = weakref.ref(self)
        self.runner.rejection_sampler.forced = ForcedAcceptance(lambda: engine().spec.proposer)
        logger.warning("BENCHMARK ONLY: forced acceptance -- the replay proposer decides which drafts verification "
                       "accepts; outputs are its recorded continuations, not the model's")

    def _num_kv_blocks(self, config: EngineConfig) -> int:
        """Blocks in the pool. With a draft model each block holds the target's and the draft's KV (one block
        table for both), so a block costs the sum of their bytes, and the draft's scratch blocks come off the
        device's free bytes first."""
        per_block = self.runner.kv_bytes_per_block
        free = self.runner.free_kv_bytes()
        if self.spec is not None:
            per_block += self.spec.kv_bytes_per_block
            if free is not None:
                free = max(0, free - self.spec.reserved_kv_bytes)
        return num_kv_blocks(config, per_block, free)

    def _check_config(self, config: EngineConfig) -> None:
        limit = self.source.arch.max_position_embeddings
        if config.model.max_model_len > limit:
            raise ValueError(f"max_model_len {config.model.max_model_len} exceeds the model's "
                             f"max_position_embeddings {limit}")
        s = config.scheduler
        if not s.enable_chunked_prefill and s.token_budget < config.model.max_model_len:
            raise ValueError(f"without chunked prefill max_num_batched_tokens ({s.token_budget}) must be >= "
                             f"max_model_len ({config.model.max_model_len})")
        tp = config.parallel.tensor_parallel_size
        if tp > 1:
            head_partition(self.source.arch.num_heads, self.source.arch.num_kv_heads, tp, 0)  # ValueError if no split
            if config.lora.enable_lora:
                raise ValueError("enable_lora is not supported with tensor_parallel_size > 1 (the LoRA layers are "
                                 "not sharded across ranks)")

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes, if any (they also stop when the engine is collected
        or the process exits)."""
        shutdown = getattr(self.runner, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def _eos_ids(self) -> set[int]:
        ids = self.source.generation_eos_ids()
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ---- requests ------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None, final_only: bool = False, lora_request=None,
                    priority: int = 0, tenant: str | None = None, session_id: str | None = None) -> None:
        """Queue a request (fanned out into `params.n` sequences). With `final_only`, `step()` returns
        its output once, when it has finished (the offline API); otherwise after every new token.

        `lora_request` (a `shared_engine.lora.LoRARequest`) runs the request on that adapter (needs
        `enable_lora`); its weights are read into the CPU cache here, so a bad adapter is refused now.
        `priority` (lower first) and `tenant` (whose fair-share counter it charges) are read by the
        scheduling policy (`scheduling_policy` priority / fair); every policy accepts both.
        `session_id` (an agent session's turns share it): with `session_pin_ttl`, the finished turn's cached
        prefix stays pinned until the session's next turn or the time-to-live ends (core/session_pins.py).

        Raises:
            ValueError: an empty prompt, a prompt + max_tokens over max_model_len, sampling parameters
                out of range, an invalid grammar or schema, an id in use, or an adapter that cannot be
                loaded (`LoRAValidationError`). The engine keeps serving everyone else.
        """
        check_scheduling_fields(priority, tenant)
        max_tokens = validate_request(prompt_token_ids, params, self.max_model_len, self.config.model.max_logprobs,
                                      self.source.arch.vocab_size)
        child_ids = [request_id] if params.n == 1 else [f"{index}_{request_id}" for index in range(params.n)]
        if any(self.outputs.in_use(rid) for rid in {request_id, *child_ids}):
            raise ValueError(f"request id {request_id!r} is already in use (by a request or one of its n choices)")
        if params.structured_outputs is not None:
            if self.grammar is None:
                raise ValueError("structured outputs need a tokenizer; this model has none")
            self.grammar.validate(params.structured_outputs)
        if lora_request is not None and getattr(self.runner, "lora", None) is None:
            raise ValueError(f"adapter {lora_request.lora_name!r} requested but LoRA is not enabled (enable_lora)")
        arrival = time.time() if arrival_time is None else arrival_time
        children = []
        for index, child_id in enumerate(child_ids):
            children.append(Request(
                request_id=child_id, prompt_token_ids=list(prompt_token_ids), sampling_params=params,
                max_tokens=max_tokens, eos_token_ids=self.eos_token_ids, arrival_time=arrival,
                parent_id=request_id, index=index, cache_salt=cache_salt, lora_request=lora_request,
                priority=priority, tenant=tenant, session_id=session_id,
            ))
        if lora_request is not None:
            for child in children:  # the first raises for a bad adapter; the rest find it cached
                self.runner.lora.acquire(child.request_id, lora_request)
        self.outputs.add_group(request_id, prompt, children, final_only)
        for child in children:
            self.scheduler.add_request(child)

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Abort requests (by the id given to `add_request`) and free their KV blocks now."""
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            for child in self.outputs.children(request_id):
                if self.scheduler.abort_request(child.request_id) is not None:
                    self.runner.release(child.request_id)
                    if self.spec is not None:
                        self.spec.release(child.request_id)
            self.outputs.drop(request_id)

    def has_unfinished_requests(self) -> bool:
        """Requests queued or running, or (async output processing) a step whose outputs are pending."""
        return self.scheduler.has_unfinished_requests() or (
            self.async_outputs is not None and self.async_outputs.in_flight is not None)

    # ---- one step ------------------------------------------------------------------------------------
    def step(self) -> list:
        """Schedule, run the model once, sample, and return the `RequestOutput`s that changed. With
        `enable_async_output_proc` or `async_scheduling` the outputs are the previous step's (see
        async_output.py)."""
        if self.async_outputs is not None:
            return self.async_outputs.step(self)
        started = time.perf_counter()
        self.propose_drafts()
        out = self.scheduler.schedule(time.time())
        if out.is_empty:
            return []
        scheduled = time.perf_counter()
        gpu_before = self.runner.gpu_span_seconds
        result = self.runner.execute(out)
        executed = time.perf_counter()
        now = time.time()
        updated = self.scheduler.update_from_output(out, result.token_ids(), now)
        outputs, num_tokens = self.process_outputs(out, result, updated, now)
        finished = time.perf_counter()
        self.stats.on_step(out, num_tokens, finished - started, self.scheduler, self.block_manager,
                           phases=(scheduled - started, executed - scheduled, finished - executed,
                                   self.runner.gpu_span_seconds - gpu_before))
        if self.spec is not None:
            self.spec.on_step(out, finished - started)
        return outputs

    def propose_drafts(self) -> None:
        """Speculative decoding: drafts for the running requests, for the next `schedule` to take."""
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)

    def process_outputs(self, out, result: StepResult, updated: list[Request],
                        now: float) -> tuple[list[RequestOutput], int]:
        """Prompt logprobs, detokenisation and stop strings for a step (`out`) whose tokens the scheduler
        has taken (`updated`: `update_from_output`'s requests); a stop string finishes its request (and
        frees its blocks) here. Returns the step's `RequestOutput`s and the tokens it added to outputs."""
        for request_id, (begin, values) in result.prompt_logprobs.items():
            self.outputs.add_prompt_logprobs(request_id, begin, values)
        if self.stats.spec is not None:
            self.stats.spec.on_step(out, result.sampled)
        num_tokens = 0
        for request in updated:
            before = request.num_output_tokens
            stop, kept = self.outputs.on_tokens(request, result.sampled[request.request_id])
            num_tokens += kept
            if stop is not None:
                if not request.is_finished:
                    request.stop_reason = stop
                    self.scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED, now)
                elif request.status is RequestStatus.FINISHED_LENGTH or request.num_output_tokens < before:
                    # the scheduler ended it in this step (an aborted request never reaches here): at a length
                    # limit at or after the string's last token, or at an EOS / stop id after it (the tokens
                    # after the string were cut): the string wins, as in vLLM. An EOS / stop id that is itself
                    # the string's last token keeps its own reason.
                    request.stop_reason = stop
                    request.status = RequestStatus.FINISHED_STOPPED
            if request.is_finished:
                self.runner.release(request.request_id)
                if self.spec is not None:
                    self.spec.on_finished(request)
                    self.spec.release(request.request_id)
        return self.outputs.collect(updated), num_tokens
