"""BENCHMARK-ONLY forced acceptance (spec_decode/forced_acceptance.py): with the engine's
`benchmark_forced_acceptance`, the replay proposer's marks decide verification, so the outputs are the recorded
continuation and the acceptance is the set one; without it nothing changes. Default model, CPU."""

from __future__ import annotations

import random

import pytest

from shared_engine import LLM, SamplingParams
from shared_engine.config import EngineConfig

RATE, K, OUT_LEN = 0.7, 3, 48


def _llm(forced: bool) -> LLM:
    return LLM(max_model_len=256, kv_cache_memory=64 * 2**20, benchmark_forced_acceptance=forced,
               speculative_config={"method": "replay", "num_speculative_tokens": K, "policy": "always",
                                   "acceptance_rate": RATE})


def _workload(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts and, per prompt, a random "recorded continuation" the model would never produce itself."""
    rng = random.Random(seed)
    prompts = [[rng.randint(100, 40000) for _ in range(12)] for _ in range(8)]
    return prompts, [[rng.randint(100, 40000) for _ in range(OUT_LEN)] for _ in prompts]


def _generate(llm: LLM, prompts: list[list[int]], max_tokens: int = OUT_LEN) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


class _MarkLog:
    """Wraps the replay proposer's `propose` to count the accepted tokens its marks intend: per draft, the
    right marks before the first wrong one."""

    def __init__(self, proposer) -> None:
        self.intended = 0
        self.first_right = 0
        self.num_drafts = 0
        original = proposer.propose

        def propose(requests, caps):
            drafts = original(requests, caps)
            for request, draft in zip(requests, drafts):
                if draft:
                    marks = proposer._outcomes[request.request_id][1]
                    run = next((j for j, m in enumerate(marks) if not m), len(marks))
                    self.intended += run
                    self.first_right += marks[0]
                    self.num_drafts += 1
            return drafts

        proposer.propose = propose


def test_forced_acceptance_replays_the_recording_at_the_set_rate():
    prompts, recorded = _workload()
    llm = _llm(forced=True)
    proposer = llm.engine.spec.proposer
    for p, t in zip(prompts, recorded):
        proposer.record(p, t)
    log = _MarkLog(proposer)
    outs = _generate(llm, prompts)
    # the first token is the prefill's (no drafts, the plain sampler: the model's own); from then on every step
    # verifies drafts and emits the recording, which the model's own greedy tokens would leave at once
    assert [o[1:] for o in outs] == [t[1:] for t in recorded]
    spec = llm.engine.stats.spec
    # every step carried exactly the accepted tokens the marks intend (drafts the scheduler ran all verified)
    assert spec.num_drafts_total == log.num_drafts > 100
    assert spec.num_accepted_tokens_total == log.intended
    # measured by the engine: position 0 is accepted with the set probability, and accepted / drafted is the
    # i.i.d. model's (a + a^2 + a^3) / 3 for full-length drafts (shorter ones only at each request's end)
    first = spec.accepted_per_pos_total[0] / spec.num_drafts_total
    assert abs(first - RATE) < 0.1, first
    expected = sum(RATE ** i for i in range(1, K + 1)) / K
    rate = spec.num_accepted_tokens_total / spec.num_draft_tokens_total
    assert abs(rate - expected) < 0.08, (rate, expected)


def test_without_the_setting_outputs_are_unchanged():
    prompts, recorded = _workload()
    prompts, recorded = prompts[:3], recorded[:3]
    llm = _llm(forced=False)
    engine, spec = llm.engine, llm.engine.spec
    assert engine.runner.rejection_sampler.forced is None
    engine.spec = None
    plain = _generate(llm, prompts, 16)  # speculation off
    engine.spec = spec
    for p, t in zip(prompts, recorded):
        spec.proposer.record(p, t)
    assert _generate(llm, prompts, 16) == plain  # random drafts are verified against the target and rejected
    assert engine.stats.spec.num_draft_tokens_total > 0
    assert engine.stats.spec.num_accepted_tokens_total < 0.05 * engine.stats.spec.num_draft_tokens_total


def test_the_setting_is_not_an_engine_setting():
    with pytest.raises(ValueError, match="benchmark_forced_acceptance"):
        EngineConfig.from_flat(benchmark_forced_acceptance=True)
    assert "benchmark_forced_acceptance" not in EngineConfig.from_flat().to_flat()
    with pytest.raises(ValueError, match="speculative_config"):
        LLM(max_model_len=128, kv_cache_memory=16 * 2**20, benchmark_forced_acceptance=True)


def test_a_dropped_forced_acceptance_engine_is_freed_without_the_garbage_collector():
    """The hook reaches the engine's proposer through a weak reference: with `lambda: self.spec.proposer` the
    engine was in a reference cycle, so its weights and KV cache outlived `del` until a collection, and the next
    engine in the process profiled them as used memory (0 KV blocks on the H200 at 9a99c62)."""
    import gc
    import weakref

    llm = _llm(forced=True)
    engine = weakref.ref(llm.engine)
    prompts, recorded = _workload(3)
    for p, t in zip(prompts[:2], recorded[:2]):
        llm.engine.spec.proposer.record(p, t)
    assert _generate(llm, prompts[:2], 8) and engine() is not None
    gc.collect()
    gc.disable()
    try:
        del llm
        assert engine() is None
    finally:
        gc.enable()
