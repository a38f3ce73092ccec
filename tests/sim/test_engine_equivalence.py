"""The simulator makes exactly the scheduling decisions the engine makes for the same arrivals.

The same small workload (arrivals on a step clock, prompts with a shared prefix so prefix caching acts, a
KV pool small enough to force preemption) runs through a real `LLMEngine` (tiny dummy-weight model, ignore_eos)
and through `Simulator` with a constant one-second step. Every step's `SchedulerOutput` is compared: which
requests, at which positions, how many tokens, which sample, and which were preempted.
"""

from __future__ import annotations

import random

import pytest

from shared_engine.config import EngineConfig
from shared_engine.model_arch import ModelArch
from shared_engine.sim import HardwareProfile, Simulator, TraceWorkload
from shared_engine.sim.workload import RequestSpec

SETTINGS = [
    # small pool: preemptions by recompute, chunked prefill, prefix cache hits
    dict(max_num_seqs=4, max_num_batched_tokens=32, num_gpu_blocks_override=14, block_size=4, max_model_len=56),
    # no chunked prefill (budget >= max_model_len), more sequences than the pool likes
    dict(max_num_seqs=6, max_num_batched_tokens=128, num_gpu_blocks_override=40, block_size=8, max_model_len=128,
         enable_chunked_prefill=False),
    # prefix caching off
    dict(max_num_seqs=3, max_num_batched_tokens=16, num_gpu_blocks_override=20, block_size=4, max_model_len=80,
         enable_prefix_caching=False),
]


class OneSecondSteps:
    def seconds_from_totals(self, *totals) -> float:
        return 1.0


def workload(seed: int = 0) -> list[RequestSpec]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 128) for _ in range(12)]
    specs = []
    for i in range(10):
        own = [rng.randrange(3, 128) for _ in range(rng.randint(3, 30))]
        prompt = shared + own if i % 2 == 0 else own
        arrival = float(rng.choice([0, 0, 1, 2, 3, 5, 9, 20]))
        specs.append(RequestSpec(f"q{i}", arrival, prompt, rng.randint(2, 14)))
    return specs


def decisions(out) -> tuple:
    items = tuple((s.request_id, s.start_position, s.num_new_tokens, s.needs_sample) for s in out.scheduled)
    return items, tuple(out.preempted_request_ids), out.num_batched_tokens


def run_engine(model_dir, settings: dict, specs: list[RequestSpec]) -> list[tuple]:
    from shared_engine import LLM, SamplingParams

    engine = LLM(str(model_dir), load_format="dummy", device="cpu", **settings).engine
    recorded = []
    original = engine.scheduler.schedule

    def schedule(now=None):
        out = original(now)
        if not out.is_empty:
            recorded.append(decisions(out))
        return out

    engine.scheduler.schedule = schedule
    pending = sorted(specs, key=lambda r: r.arrival_time)
    now = 0.0
    while pending or engine.has_unfinished_requests():  # the simulator's clock: 1 s per step
        while pending and pending[0].arrival_time <= now:
            r = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
            engine.add_request(r.request_id, r.prompt_token_ids, params, arrival_time=r.arrival_time)
        if not engine.has_unfinished_requests():
            now = pending[0].arrival_time
            continue
        engine.step()
        engine.block_manager.check_integrity()
        now += 1.0
    return recorded


def run_sim(model_dir, settings: dict, specs: list[RequestSpec]) -> tuple[list[tuple], object]:
    config = EngineConfig.from_flat(**settings)
    hardware = HardwareProfile("test-cpu", "cpu", 1e9, 1e9, 1e9, "float32")
    sim = Simulator(config, ModelArch.from_dir(model_dir), hardware, step_model=OneSecondSteps())
    recorded = []
    metrics = sim.run(TraceWorkload(specs), on_step=lambda out, now: recorded.append(decisions(out)))
    return recorded, metrics


@pytest.mark.parametrize("settings", SETTINGS, ids=["preempt-chunked", "no-chunking", "no-prefix-cache"])
def test_same_decisions_step_by_step(tiny_model_dir, settings):
    specs = workload()
    engine_steps = run_engine(tiny_model_dir, settings, specs)
    sim_steps, metrics = run_sim(tiny_model_dir, settings, workload())
    assert len(sim_steps) == len(engine_steps)
    for index, (sim_step, engine_step) in enumerate(zip(sim_steps, engine_steps)):
        assert sim_step == engine_step, f"step {index} differs"
    assert metrics.summary()["completed"] == len(specs)
    assert list(metrics.num_output) != []


def test_workload_exercises_preemption_and_prefix_hits(tiny_model_dir):
    _, metrics = run_sim(tiny_model_dir, SETTINGS[0], workload())
    summary = metrics.summary()
    assert summary["num_preemptions"] > 0
    assert summary["prefix_cache_hits"] > 0
