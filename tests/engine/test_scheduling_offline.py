"""The offline API's `priority` and `tenant`: they reach the scheduler's requests, `priority` orders
admission under `scheduling_policy="priority"`, bad values are `ValueError`s (tiny dummy-weight model)."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams


def test_priority_and_tenant_reach_the_scheduler(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), load_format="dummy", device="cpu", num_gpu_blocks_override=64,
              scheduling_policy="priority", max_num_seqs=1)
    admitted = []
    schedule = llm.engine.scheduler.schedule

    def spy(*args, **kwargs):
        out = schedule(*args, **kwargs)
        admitted.extend((s.request.priority, s.request.tenant) for s in out.scheduled if s.start_position == 0)
        return out

    llm.engine.scheduler.schedule = spy
    prompts = [[3 + i] * 12 for i in range(4)]
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False, priority=[2, 0, 3, 1], tenant=["a", "b", None, "b"])
    assert [o.prompt_token_ids for o in outputs] == prompts  # results still in prompt order
    assert admitted == [(0, "b"), (1, "b"), (2, "a"), (3, None)]
    with pytest.raises(ValueError, match="priorities"):
        llm.generate(prompts, params, use_tqdm=False, priority=[1])
    with pytest.raises(ValueError, match="tenants"):
        llm.generate(prompts, params, use_tqdm=False, tenant=["a"])
    with pytest.raises(ValueError, match="priority must be an integer"):
        llm.generate(prompts[:2], params, use_tqdm=False, priority=[0, "high"])
    with pytest.raises(ValueError, match="tenant must be"):
        llm.generate(prompts[:2], params, use_tqdm=False, tenant=["a", ""])
    assert not llm.engine.has_unfinished_requests()  # a bad value in any prompt queues none of them


def test_over_share_cap_in_the_engine(tiny_model_dir):
    """`over_share_prefill_tokens` through the offline API (tiny dummy-weight model): a heavy tenant's four
    200-token prompts beside a light tenant's decoding requests never put more than the cap of their prompt
    tokens in one step, and every request finishes with its tokens; without the cap all four go in one step."""
    def run(cap):
        llm = LLM(str(tiny_model_dir), load_format="dummy", device="cpu", num_gpu_blocks_override=256,
                  scheduling_policy="fair", over_share_prefill_tokens=cap, max_num_batched_tokens=1024)
        llm.engine.scheduler.policy.counters["heavy"] = 1000.0  # served more than the light tenant
        heavy_per_step = []
        schedule = llm.engine.scheduler.schedule

        def spy(*args, **kwargs):
            out = schedule(*args, **kwargs)
            heavy_per_step.append(sum(len(s.token_ids) for s in out.scheduled
                                      if s.request.tenant == "heavy" and s.start_position < 200))
            return out

        llm.engine.scheduler.schedule = spy
        prompts = [[3 + i % 5] * 8 for i in range(2)] + [[10 + i] * 200 for i in range(4)]
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in [40, 40, 4, 4, 4, 4]]  # light stays live
        outputs = llm.generate(prompts, params, use_tqdm=False, tenant=["light", "light"] + ["heavy"] * 4)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [40, 40, 4, 4, 4, 4]
        return heavy_per_step

    assert max(run(64)) <= 64
    assert max(run(0)) == 800
