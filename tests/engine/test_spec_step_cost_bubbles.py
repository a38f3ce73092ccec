"""What the speculation policy is told a step cost (issue 17; engine/async_output.py): with async scheduling, the
device's span plus the idle time a resolve-before-launch put before a launch, charged to the speculative step
whose drafts forced it. At b274e59 the policy saw device spans only, an 8-request speculative step looked cheaper
than a plain one at batch 448 (33.7 against 36.8 ms) while its wall time was 51 ms, and the policy drafted on 99%
of steps (0.748x of speculation off). Here the device is faked: each collected step adds GPU_S to the runner's
span and each launch holds the host LAUNCH_S, so a launch that waited for a resolve left the device idle for at
least LAUNCH_S."""

from __future__ import annotations

import time

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.sampling_params import SamplingParams

GPU_S = 0.001
LAUNCH_S = 0.02


def _engine(tiny_model_dir) -> LLMEngine:
    engine = LLMEngine(EngineConfig.from_flat(
        model=str(tiny_model_dir), device="cpu", load_format="dummy", async_scheduling=True,
        num_gpu_blocks_override=64,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "policy": "always"}))
    runner = engine.runner
    launch, collect = runner.launch, runner.collect

    def slow_launch(out, previous=None):
        step = launch(out, previous)
        time.sleep(LAUNCH_S)
        return step

    def timed_collect(step):
        result = collect(step)
        runner.gpu_span_seconds += GPU_S
        return result

    runner.launch, runner.collect = slow_launch, timed_collect
    return engine


def test_a_speculative_step_is_charged_the_idle_its_drafts_caused(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    observed = []  # (drafts, seconds) per step, in order
    on_step = engine.spec.on_step

    def record(out, seconds):
        observed.append((out.num_draft_tokens, seconds))
        on_step(out, seconds)

    engine.spec.on_step = record
    propose, calls = engine.spec.proposer.propose, []

    def every_other_step(requests, caps):  # speculative and plain steps in turn
        calls.append(None)
        return propose(requests, caps) if len(calls) % 2 else [[] for _ in requests]

    engine.spec.proposer.propose = every_other_step
    # repetitive prompts: the n-gram proposer has drafts
    for n, prompt in enumerate(([5, 6, 7, 8] * 6, [9, 10, 11] * 7, list(range(20, 40)))):
        engine.add_request(f"r{n}", prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert any(d for d, _ in observed) and any(not d for d, _ in observed[1:])
    assert engine.runner.decode_row_steps > 0  # the speculative steps' verification ran as decode rows
    # the policy `always` may draft on every step, so every launch waited for the step before it: the idle before
    # each launch is charged once, to the step before it when that one had drafts, else to the launched step
    for (drafts, seconds), nxt in zip(observed, observed[1:] + [None]):
        if drafts and nxt is not None:  # the next launch waited for this step's drafts to be resolved
            assert seconds >= GPU_S + LAUNCH_S
    after_drafts = [seconds for (before, _), (drafts, seconds) in zip(observed, observed[1:]) if before and not drafts]
    assert len(after_drafts) >= 3
    for seconds in after_drafts:  # a plain step whose wait was charged to the speculative step before it
        assert abs(seconds - GPU_S) < 1e-9
    total_idle = sum(s for _, s in observed) - GPU_S * len(observed)
    assert total_idle >= LAUNCH_S * (len(observed) - 1)  # every wait charged, none lost
