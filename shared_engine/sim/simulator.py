"""`Simulator`: the engine's own `Scheduler` and `BlockManager`, driven in simulated time with no model.

Each loop: requests whose arrival time has come are added; `Scheduler.schedule()` picks the step exactly
as in the engine; the step-time model says how long that step would take on the hardware; the clock
advances; every request that samples gets a dummy token id and `update_from_output` finishes it at its
output length (requests run with `ignore_eos`, as benchmark workloads do). When nothing is running the
clock jumps to the next arrival. Scheduling decisions therefore cannot drift from the engine's: they are
made by the same code (tests compare them step by step with a real `LLMEngine` run).

Per-step work is proportional to the step's batch (one pass over the scheduled requests), never to the
history, so 10,000 requests simulate in seconds.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable

from shared_engine.config import EngineConfig
from shared_engine.core.request import Request
from shared_engine.core.scheduler import Scheduler, build_scheduler
from shared_engine.core.scheduler_output import SchedulerOutput
from shared_engine.engine.kv_capacity import check_fits, num_kv_blocks
from shared_engine.model_arch import DTYPE_BYTES, ModelArch
from shared_engine.sampling_params import SamplingParams
from shared_engine.sim.hardware import HardwareProfile
from shared_engine.sim.metrics import SimMetrics
from shared_engine.sim.slo_watch import SloWatch
from shared_engine.sim.spec_step import SimSpeculation
from shared_engine.sim.step_time import StepShape, StepTimeModel
from shared_engine.sim.workload import RequestSpec, WorkloadGenerator
from shared_engine.sim.workload_spec import WorkloadSpec

# KV offload copies (`kv_offload_size`) cost a block's bytes over the host link, each way at its own rate on a
# GPU: measured on the H200 through the engine's offloader (pinned host memory, side stream, llama-3.1-8b's
# 2 MiB blocks, 4 GiB each way): 37.3 GB/s GPU -> host, 42.4 GB/s host -> GPU
# (benchmarks/results/kv_offload_h200_284c523.json, scripts/bench_kv_offload.py). On a CPU a copy is a
# memcpy at half the achieved memory bandwidth (read + write; an assumption). The copies are priced as added
# to the step (the forward waits for them, model_executor/kv_offloader.py).
GPU_OFFLOAD_BANDWIDTH = 37.3e9  # bytes/s, GPU -> host
GPU_RESTORE_BANDWIDTH = 42.4e9  # bytes/s, host -> GPU

DUMMY_TOKEN_ID = 0
_DUMMY_TOKENS = (DUMMY_TOKEN_ID,)  # one sampled token per row (the scheduler takes a sequence)
_PARAMS = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)


class Simulator:
    """One engine configuration on one device type; `run` simulates one replica, `run_replicas` many.

    `step_model` needs `seconds_from_totals(num_seqs, num_tokens, num_sampled, ctx_tokens, attn_pairs)`
    (see `StepTimeModel`); the default is the roofline for `arch` on `hardware`. It prices the synchronous
    step (host + device time) whatever `config.scheduler.async_scheduling` says: with async scheduling (the
    engine's CUDA default) the host's work overlaps the device's, and on the H200 runs this under-predicts
    offline throughput by 12.3% (llama-3.1-8b) and 24.9% (qwen3-0.6b). `overlap_host=True` prices the other
    bound (the longer of host and device per step): 4.8% and 7.4% over the measurements, with host and device
    fitted apart from step profiles that record each step's GPU span (benchmarks/results/
    sim_fidelity_h200.json). Capacity plans keep the conservative default: served latency percentiles run
    above both bounds (shared_engine/sim/README.md, "Fidelity").

    Raises:
        ValueError: the weights do not fit in the device memory, or `max_model_len` does not fit in the KV
            pool (the engine's own check and message).
    """

    def __init__(self, config: EngineConfig, arch: ModelArch, hardware: HardwareProfile, step_model=None,
                 overlap_host: bool = False) -> None:
        self.arch = arch
        self.hardware = hardware
        self.max_model_len = config.model.max_model_len or arch.max_position_embeddings
        self.config = config.with_model_len(self.max_model_len)
        dtype = config.model.dtype
        self.dtype = hardware.default_dtype if dtype == "auto" else dtype
        self.tensor_parallel_size = tp = config.parallel.tensor_parallel_size  # GPUs per replica
        kv_dtype = "fp8" if config.cache.fp8_kv_cache else None  # kv_cache_dtype fp8: 1 byte per element
        self.step_model = step_model or StepTimeModel(arch, self.dtype, hardware, overlap_host=overlap_host,
                                                      tensor_parallel_size=tp, kv_cache_dtype=kv_dtype)
        # each rank holds its KV heads' share of every block (the busiest rank's share sizes the pool)
        rank_shape = StepShape.from_arch(arch, self.dtype, tp, kv_dtype)
        self._rank_weight_bytes = rank_shape.weight_bytes + (
            0 if arch.tie_word_embeddings else rank_shape.head_flops_per_sample / 2 * DTYPE_BYTES[self.dtype])
        bytes_per_block = rank_shape.kv_bytes_per_token * self.config.cache.block_size
        self.num_blocks = num_kv_blocks(self.config, bytes_per_block, self.free_kv_bytes())
        check_fits(self.num_blocks, self.config.cache.block_size, self.max_model_len)
        self.num_host_blocks = self.config.cache.num_host_blocks(bytes_per_block)
        gpu = hardware.kind != "cpu"
        memcpy = hardware.achieved_bandwidth / 2
        self.offload_s_per_block = bytes_per_block / (GPU_OFFLOAD_BANDWIDTH if gpu else memcpy)
        self.restore_s_per_block = bytes_per_block / (GPU_RESTORE_BANDWIDTH if gpu else memcpy)

    def free_kv_bytes(self) -> int | None:
        """GPU: device memory * gpu_memory_utilization - weights - peak activations at the token budget (as
        the engine's profiling pass measures them; estimated here), per GPU: under tensor parallelism the
        busiest rank's weight shard (embedding shard included) and activations / N. CPU: None (the engine's
        byte default)."""
        if self.hardware.kind == "cpu":
            return None
        a, size = self.arch, DTYPE_BYTES[self.dtype]
        tokens = min(self.config.scheduler.token_budget, self.max_model_len)
        width = 3 * a.hidden_size + 2 * a.intermediate_size + (a.num_heads + 2 * a.num_kv_heads) * a.head_dim
        activations = tokens * width * size / self.tensor_parallel_size + 4 * a.vocab_size
        weights = a.weight_bytes(self.dtype) if self.tensor_parallel_size == 1 else self._rank_weight_bytes
        budget = self.hardware.memory_bytes * self.config.cache.gpu_memory_utilization - weights - activations
        if budget <= 0:
            raise ValueError(f"{weights / 1e9:.1f} GB of weights ({self.dtype}) do not fit in "
                             f"{self.hardware.memory_bytes / 1e9:.0f} GB * gpu_memory_utilization "
                             f"{self.config.cache.gpu_memory_utilization} on {self.hardware.name}")
        return int(budget)

    def new_scheduler(self) -> Scheduler:
        """Built by the same function `LLMEngine` uses (prefix caching and eviction policy included)."""
        return build_scheduler(self.config, self.num_blocks, self.max_model_len, self.num_host_blocks)

    def run(self, workload, metrics: SimMetrics | None = None,
            on_step: Callable[[SchedulerOutput, float], None] | None = None,
            slo_watch: SloWatch | None = None) -> SimMetrics:
        """Simulate one replica until the workload is exhausted and every request finished.

        `workload` has `peek_time()`, `pop_due(now)` and `on_finish(spec, output_ids, now)` (a
        `WorkloadGenerator` or `TraceWorkload`). `on_step(out, now)` sees every non-empty step. With
        `slo_watch`, the run stops (`metrics.slo_missed`) as soon as the watch says its SLO is missed.
        """
        with _cyclic_gc_paused():
            return self._run(workload, metrics or SimMetrics(num_blocks=self.num_blocks), on_step, slo_watch)

    def _run(self, workload, metrics: SimMetrics, on_step, slo_watch: SloWatch | None) -> SimMetrics:
        scheduler = self.new_scheduler()
        block_manager = scheduler.block_manager
        seconds = self.step_model.seconds_from_totals
        specs: dict[str, RequestSpec] = {}
        itl = metrics.itl
        speculation = SimSpeculation.of(self.config, self.max_model_len)  # None: speculation off
        now = 0.0
        while True:
            if workload.peek_time() <= now:
                for spec in workload.pop_due(now):
                    specs[spec.request_id] = spec
                    scheduler.add_request(_request(spec))
            if not scheduler.has_unfinished_requests():
                upcoming = workload.peek_time()
                if upcoming == math.inf:
                    metrics.on_end(scheduler)
                    return metrics
                now = max(now, upcoming)
                continue
            if speculation is not None:
                speculation.propose(scheduler.running)
            out = scheduler.schedule(now)
            if out.is_empty:
                self._stalled(scheduler, workload)
                now = workload.peek_time()
                continue
            # One pass over the step: the roofline's totals, the dummy tokens, the sampling requests' last
            # token times (for ITL).
            starts = pairs = 0
            sampled = {}
            last_token_times = []
            for item in out.scheduled:
                n = len(item.token_ids)
                start = item.start_position
                starts += start
                pairs += n * start + (n * (n + 1) >> 1)
                if item.needs_sample:
                    request = item.request
                    sampled[request.request_id] = (speculation.tokens(item.num_draft_tokens)
                                                   if item.num_draft_tokens else _DUMMY_TOKENS)
                    if request.last_token_time is not None:
                        last_token_times.append(request.last_token_time)
            num_tokens = out.num_batched_tokens
            step_s = seconds(len(out.scheduled), num_tokens, len(sampled), starts + num_tokens, pairs)
            if out.kv_offloads or out.kv_restores:
                copy_s = (len(out.kv_offloads) * self.offload_s_per_block
                          + len(out.kv_restores) * self.restore_s_per_block)
                metrics.host_copy_s += copy_s
                step_s += copy_s
            now += step_s
            itl.extend([now - t for t in last_token_times])
            updated = scheduler.update_from_output(out, sampled, now)
            metrics.on_step(step_s, block_manager.usage, len(out.preempted_request_ids))
            if on_step is not None:
                on_step(out, now)
            for request in updated:
                if request.is_finished:
                    metrics.on_finish(request)
                    workload.on_finish(specs.pop(request.request_id), request.output_token_ids, now)
                    if slo_watch is not None and slo_watch.missed(request):
                        metrics.slo_missed = True
                        return metrics

    def _stalled(self, scheduler: Scheduler, workload) -> None:
        """Nothing schedulable although requests wait: only an arrival can change that."""
        if workload.peek_time() == math.inf:
            head = scheduler.waiting[0] if scheduler.waiting else None
            raise RuntimeError(f"the scheduler can make no progress (waiting {scheduler.num_waiting}, running "
                               f"{scheduler.num_running}, first waiting needs {head and head.num_tokens} tokens "
                               f"of {self.num_blocks * self.config.cache.block_size} in the KV pool)")

    def run_replica(self, spec: WorkloadSpec, replica: int, num_replicas: int, stop_on_slo_miss: dict | None = None
                    ) -> SimMetrics:
        """Replica `replica` of `num_replicas`: its share of the workload's traffic, simulated alone.
        `stop_on_slo_miss`: an SLO; the replica stops as soon as the whole run certainly misses it."""
        watch = None
        if stop_on_slo_miss and spec.num_requests is not None:
            watch = SloWatch(stop_on_slo_miss, spec.num_requests)
        workload = WorkloadGenerator(spec, self.arch.vocab_size, self.max_model_len, replica, num_replicas)
        return self.run(workload, slo_watch=watch if watch is not None and watch.active else None)

    def run_replicas(self, spec: WorkloadSpec, num_replicas: int, map_fn: Callable = map,
                     stop_on_slo_miss: dict | None = None) -> SimMetrics:
        """`num_replicas` independent engines, requests routed at random (sessions sticky).

        Replicas share nothing, so `map_fn` may run them in parallel (a process pool's `map`); they are
        merged in replica order either way, so the result does not depend on it. With `stop_on_slo_miss`
        (an SLO), a replica that finds the SLO certainly missed stops early and the result has
        `slo_missed` set (its figures are then partial).
        """
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        total = SimMetrics(num_replicas=num_replicas, num_blocks=self.num_blocks)
        n = num_replicas
        for metrics in map_fn(self.run_replica, [spec] * n, range(n), [n] * n, [stop_on_slo_miss] * n):
            total.merge(metrics)
        return total


@contextlib.contextmanager
def _cyclic_gc_paused():
    """The loop allocates millions of short-lived objects and makes no reference cycles: Python's cyclic
    collector would only spend time (about 5% of a long run) traversing the live requests' token lists."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _request(spec: RequestSpec) -> Request:
    return Request(request_id=spec.request_id, prompt_token_ids=spec.prompt_token_ids, sampling_params=_PARAMS,
                   max_tokens=spec.max_tokens, arrival_time=spec.arrival_time, lora_name=spec.lora_name,
                   tenant=spec.tenant, session_id=spec.session_id)
