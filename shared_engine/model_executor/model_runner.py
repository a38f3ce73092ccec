"""`ModelRunner`: owns the model, the paged KV cache and the sampler; runs one `SchedulerOutput`."""

from __future__ import annotations

import logging
import time

import torch

from shared_engine.config import EngineConfig
from shared_engine.core.scheduler_output import SchedulerOutput
from shared_engine.distributed.parallel_state import get_tp_rank, get_tp_world_size, tp_broadcast
from shared_engine.distributed.partition import max_local_kv_heads
from shared_engine.model_executor.attention.registry import get_backend
from shared_engine.model_executor.cuda_graph_runner import (
    MAX_PREFILL_SEQS,
    CudaGraphRunner,
    budget_filling_sizes,
    is_varlen,
    mixed_buckets,
    varlen_buckets,
)
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.model_executor.kv_offloader import STAGING_BYTES, KVOffloader
from shared_engine.model_executor.layers.fp8_linear import FP8_DTYPE, check_fp8_supported, quantize_linear_layers
from shared_engine.model_executor.layers.lora import LORA_ALL, LORA_ATTENTION, step_tile_m
from shared_engine.model_executor.layers.rotary_embedding import RotaryEmbedding
from shared_engine.model_executor.models.registry import get_model_class
from shared_engine.model_executor.nano_batch import NanoBatchForward
from shared_engine.model_executor.pinned_staging import PinnedStaging
from shared_engine.model_executor.pinned_staging import enabled as pinned_inputs_enabled
from shared_engine.model_executor.prompt_logprobs import (
    PROMPT_LOGPROBS_CHUNK,
    prompt_token_entries,
    step_prompt_logprobs,
)
from shared_engine.model_executor.step_result import LaunchedStep, StepResult
from shared_engine.model_loader.model_source import ModelSource
from shared_engine.model_loader.weight_loader import init_dummy, load_safetensors
from shared_engine.sampling.grammar import GrammarBackend
from shared_engine.sampling.logits_processors import LogitsProcessors
from shared_engine.sampling.rejection_sampler import RejectionSampler
from shared_engine.sampling.sampler import Sampler, SampleResult

logger = logging.getLogger(__name__)

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, source: ModelSource, grammar: GrammarBackend | None = None) -> None:
        """`grammar` compiles structured-output constraints (None: the model has no tokenizer)."""
        self.config = config
        tp = config.parallel.tensor_parallel_size
        if get_tp_world_size() != tp:
            raise RuntimeError(f"tensor_parallel_size {tp} but this process is in a group of {get_tp_world_size()} "
                               "ranks (one tensor-parallel engine per process: shut the other one down first)")
        self.device = torch.device(config.device.resolve())
        if self.device.type == "cuda" and tp > 1:
            self.device = torch.device("cuda", get_tp_rank())
        if self.device.type == "cpu" or config.device.num_threads is not None:
            # process-wide: every CPU kernel's OpenMP threads (benchmarks/cpu_contention.py measures why);
            # tensor-parallel ranks on one CPU share its cores unless num_threads is set explicitly
            threads = config.device.resolve_num_threads()
            if self.device.type == "cpu" and tp > 1 and config.device.num_threads is None:
                threads = max(1, threads // tp)
            torch.set_num_threads(threads)
        # Rank 0 samples; with async scheduling the other ranks receive its ids (their next step's
        # placeholder inputs read them), see `_sample`.
        self.is_driver = get_tp_rank() == 0
        self.broadcast_sampled = tp > 1 and bool(config.scheduler.async_scheduling)
        self.dtype_name = config.model.resolved_dtype(self.device.type)
        self.dtype = _TORCH_DTYPES[self.dtype_name]
        if config.model.quantization == "fp8":
            check_fp8_supported(self.device, self.dtype)  # ValueError naming the flag (the CPU path refuses)
        # kv_cache_dtype fp8: float8_e4m3fn pool, 1 byte per element (the memory profile sizes the pool in it)
        self.kv_dtype_name = "fp8" if config.cache.fp8_kv_cache else self.dtype_name
        self.kv_cache_dtype = FP8_DTYPE if config.cache.fp8_kv_cache else self.dtype
        self.arch = source.arch
        self.block_size = config.cache.block_size
        self.backend = get_backend("triton" if self.device.type == "cuda" else "torch")
        # Cascade decode attention: Triton only, and only prefix caching makes sequences share blocks.
        self.enable_cascade = (self.device.type == "cuda" and not config.model.disable_cascade_attn
                               and config.cache.enable_prefix_caching)
        self.sampler = Sampler(seed=config.model.seed, processors=LogitsProcessors(grammar))
        self.rejection_sampler = RejectionSampler(self.sampler, use_kernel=self.device.type == "cuda")
        started = time.perf_counter()
        self.model = self._load(source)
        self.load_seconds = time.perf_counter() - started
        self.lora = None  # LoRAManager with enable_lora: the CPU cache and GPU slots of adapters
        # speculative method draft_model: the draft's `DraftModelRunner`, whose KV cache mirrors this one's
        # (every step's inputs also run through the draft; spec_decode/draft_model_runner.py)
        self.draft_runner = None
        if config.lora.enable_lora:
            from shared_engine.lora.lora_manager import LoRAManager

            # token rows: a step's tokens, or a CUDA graph's padded rows (at most max_num_seqs decodes + the
            # prefill tokens, themselves within the budget)
            max_rows = config.scheduler.token_budget + config.scheduler.max_num_seqs
            self.lora = LoRAManager(self.model, config.lora, self.arch, max_rows)
        self.kv_caches: list[torch.Tensor] = []
        self.offloader: KVOffloader | None = None  # kv_offload_size > 0: the host tier's buffer and copies
        self.graph_runner: CudaGraphRunner | None = None
        # nano_batch_min_decodes: large decode steps as two overlapped nano-batches (nano_batch.py; TP 1 only)
        nano = config.device.nano_batch_min_decodes
        self.nano_forward = NanoBatchForward(self.model, nano) if nano else None
        self.nano_batch_graph_steps = 0  # graph steps replayed from a graph captured as nano-batches
        # CUDA: each step's inputs cross in one copy from pinned memory (pinned_staging.py)
        self.staging = PinnedStaging(self.device, depth=4) if pinned_inputs_enabled(self.device) else None
        self.compile_seconds = 0.0  # first forward pass (Triton JIT) during profiling
        self.gpu_span_seconds = 0.0  # CUDA: device time from the first kernel of a step to its sampled ids
        self.capture_seconds = 0.0
        self.num_cuda_graphs = 0
        self.graph_steps = 0  # steps replayed from a CUDA graph (the rest ran eagerly)
        self.mixed_graph_steps = 0  # of those, steps with prefill chunks
        self.decode_row_steps = 0  # steps whose short multi-token sequences ran as decode rows (input_builder.py)
        self.cascade_steps = 0  # steps whose decodes ran cascade attention (graphed or eager)
        self.cascade_graph_steps = 0  # of those, steps replayed from a cascade graph
        self.base_only_graph_steps = 0  # LoRA engine: graph steps replayed without the LoRA layers (no adapter)
        self.attention_lora_graph_steps = 0  # LoRA engine: graph steps with the q/k/v/o LoRA only (no MLP LoRA)
        self.varlen_graph_steps = 0  # speculative steps replayed from a varlen graph

    def _load(self, source: ModelSource) -> torch.nn.Module:
        torch.manual_seed(self.config.model.seed)
        model_cls = get_model_class(self.arch.architecture)
        # parameters are created in the model's dtype: an fp32 copy first would need twice the memory (the
        # rank's 35B parameters of llama-3.1-70b at TP=2 take 141 GB in fp32, more than an H200 holds)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                max_position = self.config.model.max_model_len or self.arch.max_position_embeddings
                model = model_cls(self.arch, max_position=max_position)
        finally:
            torch.set_default_dtype(default_dtype)
        model.to(self.dtype)  # buffers built in fp32 (the RoPE table, made fp32 again below)
        self.num_kv_heads = model.model.layers[0].self_attn.num_kv_heads  # this rank's share (distributed/partition.py)
        for module in model.modules():  # the RoPE table stays fp32 (the rotary kernel reads fp32 cos/sin)
            if isinstance(module, RotaryEmbedding):
                module.cos_sin_cache = module.cos_sin_cache.float()
        if self.config.model.load_format == "dummy":
            init_dummy(model, seed=self.config.model.seed)
        else:
            load_safetensors(model, source.path)
        if self.config.model.quantization == "fp8":
            quantize_linear_layers(model)  # per-output-channel fp8 weights; the bf16 copies are freed
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return model.eval()

    # ---- KV cache ------------------------------------------------------------------------------------
    def free_kv_bytes(self) -> int | None:
        """CUDA: bytes left for the KV cache under `gpu_memory_utilization` after the weights and the peak
        activations of a profiling forward pass at `max_num_batched_tokens` (with `draft_runner`, the draft
        model's weights, loaded before, and its own profiling pass count too). CPU: None (sized by bytes)."""
        if self.device.type != "cuda":
            return None
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        num_tokens = min(self.config.scheduler.token_budget, self.config.model.max_model_len)
        self._profile_run(num_tokens)
        if self.draft_runner is not None:  # a draft model's weights are already in; its activations too
            self.draft_runner.profile_run(num_tokens)
        self.compile_seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        staging = STAGING_BYTES if self.config.cache.kv_offload_size > 0 else 0  # the offloader's buffer
        self.profiled_peak_bytes = peak  # what the profile found (the memory tests read it)
        return max(0, int(total * self.config.cache.gpu_memory_utilization) - peak - staging)

    @torch.inference_mode()
    def _profile_run(self, num_tokens: int) -> None:
        from shared_engine.core.request import Request
        from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
        from shared_engine.sampling_params import SamplingParams

        num_blocks = -(-num_tokens // self.block_size)
        self.allocate_kv_cache(num_blocks, with_host_tier=False)
        request = Request("profile", [0] * num_tokens, SamplingParams(max_tokens=1), max_tokens=1)
        out = SchedulerOutput([ScheduledRequest(request, [0] * num_tokens, 0, list(range(num_blocks)), True)],
                              num_batched_tokens=num_tokens)
        inputs = build_inputs(out, self.block_size, self.device)
        if self.lora is not None:  # profile the LoRA layers' activations too (every group)
            self.lora.ctx.use_variant(LORA_ALL)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.backend)
        self.model.compute_logits(hidden[inputs.sample_indices])
        rows = min(PROMPT_LOGPROBS_CHUNK, num_tokens)  # one prompt-logprobs chunk counts in the peak
        prompt_token_entries(self.model.compute_logits, hidden[:rows], [0] * rows, self.config.model.max_logprobs)
        torch.cuda.synchronize(self.device)
        self.kv_caches = []
        del hidden

    @property
    def max_decode_rows(self) -> int | None:
        """The most rows a decode CUDA graph holds (None without graphs: any number of decode rows runs
        eagerly); bounds the steps whose short sequences `build_inputs` gives the kernels as decode rows."""
        graphs = self.graph_runner
        return graphs.decode_sizes[-1] if graphs is not None and graphs.decode_sizes else None

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes of one KV block on the rank that holds the most KV heads (all ranks share one block table)."""
        a = self.arch
        most = max_local_kv_heads(a.num_heads, a.num_kv_heads, self.config.parallel.tensor_parallel_size)
        return a.kv_bytes_per_token(self.kv_dtype_name) * self.block_size * most // a.num_kv_heads

    def allocate_kv_cache(self, num_blocks: int, with_host_tier: bool = True) -> None:
        """One tensor per layer: `[2, num_blocks, block_size, num_kv_heads, head_dim]` (K then V) in the KV cache
        dtype (the model's, or float8_e4m3fn); with `kv_offload_size` (and `with_host_tier`), the host tier's
        buffer (`CacheConfig.num_host_blocks`)."""
        shape = (2, num_blocks, self.block_size, self.num_kv_heads, self.arch.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
                          for _ in range(self.arch.num_layers)]
        self.offloader = None
        num_host = self.config.cache.num_host_blocks(self.kv_bytes_per_block) if with_host_tier else 0
        if num_host > 0:
            self.offloader = KVOffloader(self.kv_caches, num_host)

    def capture_cuda_graphs(self) -> None:
        """Capture CUDA graphs (CUDA, unless `enforce_eager`): decode-only steps for `cuda_graph_sizes` up
        to max_num_seqs, and mixed prefill + decode steps up to `cuda_graph_max_prefill_tokens` prefill
        tokens, each with a cascade-attention variant where it can pay, and with speculative decoding varlen
        graphs for steps of more k + 1-token decodes than the mixed graphs hold (see `CudaGraphRunner`)."""
        cfg = self.config
        if self.device.type != "cuda" or cfg.device.enforce_eager:
            return
        max_num_seqs = cfg.scheduler.max_num_seqs
        decode_sizes = [s for s in cfg.device.cuda_graph_sizes if s <= max_num_seqs]
        max_prefill = min(cfg.device.cuda_graph_max_prefill_tokens, cfg.scheduler.token_budget)
        mixed_decode, mixed_prefill = mixed_buckets(max_num_seqs, max_prefill)
        filling = budget_filling_sizes(mixed_decode, cfg.scheduler.token_budget, max_prefill)
        prefill_seqs = min(MAX_PREFILL_SEQS, max_num_seqs)
        k = cfg.speculative_config.num_speculative_tokens if cfg.speculative_config is not None else 0
        varlen = varlen_buckets(max_num_seqs, k, prefill_seqs if mixed_prefill else 0)
        if not decode_sizes and not mixed_prefill and not varlen:
            return
        started = time.perf_counter()
        max_len = cfg.model.max_model_len
        with torch.inference_mode():
            self.graph_runner = CudaGraphRunner(
                self.model, self.kv_caches, self.backend, decode_sizes=decode_sizes,
                mixed_decode_sizes=mixed_decode, mixed_prefill_sizes=mixed_prefill,
                max_prefill_seqs=prefill_seqs, max_blocks_per_seq=-(-max_len // self.block_size),
                max_model_len=max_len, device=self.device, enable_cascade=self.enable_cascade,
                extra_mixed_sizes=filling, lora_ctx=None if self.lora is None else self.lora.ctx,
                varlen_sizes=varlen, varlen_max_query_len=k + 1 if varlen else 0, nano_forward=self.nano_forward)
        self.capture_seconds = time.perf_counter() - started
        self.num_cuda_graphs = len(self.graph_runner.graphs)

    # ---- one step ------------------------------------------------------------------------------------
    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run one step and wait for its sampled tokens (`launch` then `collect`)."""
        return self.collect(self.launch(out))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, previous: LaunchedStep | None = None) -> LaunchedStep:
        """Enqueue one step (inputs, forward as a CUDA graph replay where one fits, logits, sampling, and the
        copy of the sampled ids to pinned host memory) and return without waiting for the device, so that
        the host can work while it runs (async output processing). Steps must be collected in launch order.
        Sampling never waits (its per-row settings reach the device from pinned memory,
        `sampling/device_tensor.py`); prompt logprobs, when a request asks for them, do. With async
        scheduling `out` may be scheduled before `previous` (the step in flight) is collected: its
        placeholder input tokens are that step's sampled ids, read on the device."""
        cuda = self.device.type == "cuda"
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        if out.kv_offloads or out.kv_restores:  # before the forward that reads (and overwrites) these blocks
            self.offloader.run(out.kv_offloads, out.kv_restores)
        inputs = build_inputs(out, self.block_size, self.device, cascade=self.enable_cascade, staging=self.staging,
                              max_decode_rows=self.max_decode_rows)
        inputs.patch_placeholders(None if previous is None else previous.tokens)
        token_slots = None if self.lora is None else self.lora.prepare(out)  # sets lora.ctx.active
        lora_active = self.lora.ctx.variant() if self.lora is not None else False
        self.cascade_steps += inputs.meta.use_cascade
        self.decode_row_steps += inputs.meta.num_seqs != len(out.scheduled)
        if cuda:
            span[0].record()
        num_tokens = inputs.input_ids.shape[0]
        key = None if self.graph_runner is None else self.graph_runner.select(inputs.meta, num_tokens, lora_active)
        if token_slots is not None:  # the LoRA slot map in the rows the step runs in (a graph's padded layout)
            if key is not None:
                token_slots = self.graph_runner.pad_rows(key, inputs.meta.num_decodes, token_slots, -1)
            self.lora.ctx.set_token_slots(token_slots, step_tile_m(num_tokens, graphed=key is not None))
        if key is not None:
            hidden = self.graph_runner.run(key, inputs.input_ids, inputs.positions, inputs.meta)
            self.graph_steps += 1
            self.mixed_graph_steps += key[1] > 0
            self.cascade_graph_steps += key[2]
            self.base_only_graph_steps += self.lora is not None and not key[3]
            self.attention_lora_graph_steps += key[3] == LORA_ATTENTION
            self.varlen_graph_steps += is_varlen(key)
            self.nano_batch_graph_steps += key in self.graph_runner.nano_keys
        elif self.nano_forward is not None and self.nano_forward.applies(inputs.meta, num_tokens, bool(lora_active)):
            hidden = self.nano_forward(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.backend)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.backend)
        if self.lora is not None:
            self.lora.step_enqueued()  # with a slot-load stream: later loads into this step's slots wait for it
        prompt_logprobs = step_prompt_logprobs(self.model.compute_logits, out, hidden)
        requests = [out.scheduled[row].request for row in inputs.sampled_rows]
        tokens = token_ids = raw_logprobs = copied = None
        if requests:
            logits = self.model.compute_logits(hidden[inputs.sample_indices])  # [num_logits, vocab]
            if out.num_draft_tokens:
                drafts = [out.scheduled[row].draft_token_ids for row in inputs.sampled_rows]
                emitted, raw_logprobs = self._verify(logits, requests, drafts)
            else:
                tokens, raw_logprobs = self._sample(logits, requests)
                emitted = tokens[:, None]
            if cuda:
                token_ids = torch.empty(emitted.shape, dtype=emitted.dtype, pin_memory=True)
                token_ids.copy_(emitted, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record()
            else:
                token_ids = emitted
        if self.draft_runner is not None:  # after the sampled ids' copy, so they are not held up by it
            self.draft_runner.mirror(inputs, out)
        if cuda:
            span[1].record()
        return LaunchedStep(requests, tokens, token_ids, inputs.num_logits, copied, raw_logprobs, prompt_logprobs,
                            span)

    @torch.inference_mode()
    def collect(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step's sampled ids and return its `StepResult`."""
        sampled: dict[str, list[SampleResult]] = {}
        if step.requests:
            if step.copied is not None:
                step.copied.synchronize()
            rows = step.token_ids.tolist()
            if step.token_ids.shape[1] > 1:
                rows = [[t for t in row if t >= 0] for row in rows]
            results = self.sampler.results(rows, step.raw_logprobs, step.requests, step.num_logits)
            sampled = {request.request_id: result for request, result in zip(step.requests, results)}
        if step.span is not None:
            start, end = step.span
            end.synchronize()
            self.gpu_span_seconds += start.elapsed_time(end) / 1e3
        return StepResult(sampled, step.prompt_logprobs)

    def _sample(self, logits: torch.Tensor, requests: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rank 0's sampler (`Sampler.sample`); the other ranks of a tensor-parallel group sample nothing
        and, with async scheduling, receive rank 0's ids `[num_sampled]` int64 by broadcast."""
        if self.is_driver:
            tokens, raw_logprobs = self.sampler.sample(logits, requests)
        else:
            tokens, raw_logprobs = torch.empty(len(requests), dtype=torch.long, device=self.device), None
        if self.broadcast_sampled:
            tp_broadcast(tokens)
        return tokens, raw_logprobs

    def _verify(self, logits: torch.Tensor, requests: list, drafts: list[list[int]]):
        """Rank 0's rejection sampler; the other ranks receive its emitted tokens `[num_sampled, k + 1]` by
        broadcast (as `_sample`)."""
        if self.is_driver:
            # a draft model's q for its sampled drafts (None: every draft one-hot)
            q = None if self.draft_runner is None else self.draft_runner.draft_probs(requests, drafts)
            emitted, raw_logprobs = self.rejection_sampler.sample(logits, requests, drafts, q)
        else:
            k = max(len(d) for d in drafts)
            emitted, raw_logprobs = torch.empty((len(requests), k + 1), dtype=torch.long, device=self.device), None
        if self.broadcast_sampled:
            tp_broadcast(emitted)
        return emitted, raw_logprobs

    def release(self, request_id: str) -> None:
        self.sampler.release(request_id)
        if self.lora is not None:
            self.lora.release(request_id)

