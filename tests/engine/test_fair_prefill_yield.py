"""The fair policy's long-prefill yield (core/scheduling/fair.py), in scheduler steps without a model: a light
tenant's request that arrives while a heavy tenant's long prompt is mid-prefill gets a first step that holds no
chunk of that prompt; the heavy prompt goes on in the next step; FCFS (and `fair` without a chunk cap) keep the
chunk in the light request's step; a stream of light requests cannot stall the long prompt for good; only a
tenant served no more than the heavy one is let ahead; the VTC bound still holds."""

from __future__ import annotations

import itertools
import random

import pytest

from shared_engine.config import SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request
from shared_engine.core.scheduler import Scheduler
from shared_engine.sampling_params import SamplingParams

_ids = itertools.count()


def make(tenant, prompt_len, max_tokens=4):
    return Request(f"{tenant}-{next(_ids)}", [5 + next(_ids) % 7] * prompt_len,
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True), max_tokens=max_tokens, tenant=tenant)


def scheduler(policy, threshold=32, budget=64, max_num_seqs=8, num_blocks=1024):
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, scheduling_policy=policy,
                             long_prefill_token_threshold=threshold)
    return Scheduler(config, BlockManager(num_blocks, 16), max_model_len=4096)


def step(sched):
    """One step as the capacity model drives it: {request id: tokens scheduled}."""
    out = sched.schedule()
    sched.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.needs_sample})
    sched.block_manager.check_integrity()
    return {s.request_id: s.num_new_tokens for s in out.scheduled}


def heavy_mid_prefill(policy, threshold=32):
    """A heavy tenant's 400-token prompt two chunks into its prefill; returns (scheduler, heavy request)."""
    sched = scheduler(policy, threshold)
    heavy = make("heavy", 400, 8)
    sched.add_request(heavy)
    for _ in range(2):
        step(sched)
    assert heavy.num_computed_tokens == (2 * threshold if threshold else 128)
    return sched, heavy


def test_light_request_first_step_holds_no_heavy_chunk():
    sched, heavy = heavy_mid_prefill("fair")
    sched.policy.counters["light"] = 0.0  # a light tenant served less than heavy so far
    light = make("light", 8)
    sched.add_request(light)
    first = step(sched)
    assert first == {light.request_id: 8}  # its whole prompt, and nothing of the heavy prompt's
    assert sched.num_prefill_yields_total == 1
    assert light.output_token_ids  # first token sampled in that one step
    after = step(sched)
    assert after[heavy.request_id] == 32 and after[light.request_id] == 1  # heavy goes on, light decodes
    assert sched.num_prefill_yields_total == 1


@pytest.mark.parametrize(("policy", "threshold"), [("fcfs", 32), ("fair", 0)])
def test_without_the_rule_the_heavy_chunk_shares_the_light_first_step(policy, threshold):
    sched, heavy = heavy_mid_prefill(policy, threshold)
    light = make("light", 8)
    sched.add_request(light)
    first = step(sched)
    if threshold:  # the chunk cap leaves budget for the light prompt, in a step with the heavy chunk
        assert first == {heavy.request_id: 32, light.request_id: 8}
    else:  # no cap: the heavy prompt takes the whole budget and the light request waits for its end
        assert first == {heavy.request_id: 64} and not light.output_token_ids
    assert sched.num_prefill_yields_total == 0


def test_heavy_prompt_does_not_yield_to_a_tenant_served_more():
    sched, heavy = heavy_mid_prefill("fair")
    sched.policy.counters["busy"] = sched.policy.counters["heavy"] + 500  # served more than heavy
    busy = make("busy", 8)
    sched.add_request(busy)
    assert sched.policy.counters["busy"] > sched.policy.counters["heavy"]  # the lift does not lower it
    assert step(sched) == {heavy.request_id: 32, busy.request_id: 8}
    assert sched.num_prefill_yields_total == 0


def test_heavy_prompt_does_not_yield_to_its_own_tenant():
    sched, heavy = heavy_mid_prefill("fair")
    own = make("heavy", 8)
    sched.add_request(own)
    assert step(sched) == {heavy.request_id: 32, own.request_id: 8}


def test_a_stream_of_light_requests_cannot_stall_the_long_prompt():
    """A new light request every step (five light tenants in turn): each admission charges its tenant, so
    the heavy prompt yields only while a light counter is at most heavy's, and its prefill finishes."""
    sched, heavy = heavy_mid_prefill("fair")
    yields_seen = 0
    for i in range(200):
        if heavy.num_computed_tokens >= 400:
            break
        tenant = f"light{i % 5}"
        sched.add_request(make(tenant, 8, 2))
        counters_before = dict(sched.policy.counters)
        before = sched.num_prefill_yields_total
        scheduled = step(sched)
        if sched.num_prefill_yields_total > before:  # it yielded: to a tenant not above it
            yields_seen += 1
            assert heavy.request_id not in scheduled
            assert counters_before.get(tenant, 0.0) <= counters_before["heavy"]
    assert heavy.num_computed_tokens >= 400, heavy.num_computed_tokens
    assert 0 < yields_seen < i  # it yielded, and it got steps too
    assert sched.policy.counters["heavy"] >= 400  # its whole prompt charged


@pytest.mark.parametrize("seed", range(4))
def test_vtc_bound_holds_with_the_yield(seed):
    """Four backlogged tenants with long and short prompts, chunk cap on: the service gap between any two
    backlogged tenants stays within 2 x max(wp x max input, wq x max_num_seqs x max output)."""
    rng = random.Random(seed)
    seqs, budget, max_in, max_out = 8, 128, 300, 8
    sched = scheduler("fair", threshold=48, budget=budget, max_num_seqs=seqs, num_blocks=4096)
    for _ in range(60):
        for tenant in "abcd":
            prompt = rng.randint(1, max_in) if tenant in "ab" else rng.randint(1, 16)
            sched.add_request(make(tenant, prompt, rng.randint(1, max_out)))
    bound = 2 * max(1 * max_in, 2 * seqs * max_out)
    for _ in range(300):
        step(sched)
        live = {r.tenant for r in sched.waiting}
        values = [sched.policy.counters.get(t, 0.0) for t in live]
        assert len(live) < 2 or max(values) - min(values) <= bound
    assert sched.num_prefill_yields_total > 0
