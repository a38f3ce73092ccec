"""The fair policy's over-share prefill cap (`over_share_prefill_tokens`, core/share_cap.py), in scheduler steps
without a model: a heavy tenant's prompts under the long-prefill threshold (so neither chunked nor yielding
before) go into steps of at most the cap while a light tenant has requests, and the light request's first
step holds none of them; without the cap (the config at aab412d) four whale documents share one step with
the light request. Not capped: a tenant alone, the least-served tenant, prompts within the cap whatever
their tenant's counter. The VTC bound still holds."""

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
CAP, DOC = 128, 250  # the H200 config's cap; a whale document's uncached tokens (under the 256 threshold)


def make(tenant, prompt_len, max_tokens=4):
    """A request whose prompt shares no prefix-cache block with any other's."""
    rng = random.Random(next(_ids))
    return Request(f"{tenant}-{next(_ids)}", [rng.randrange(10, 30000) for _ in range(prompt_len)],
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True), max_tokens=max_tokens, tenant=tenant)


def scheduler(cap=CAP, budget=8192, threshold=256, max_num_seqs=64, num_blocks=4096):
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, scheduling_policy="fair",
                             long_prefill_token_threshold=threshold, max_num_partial_prefills=8,
                             max_long_partial_prefills=2, over_share_prefill_tokens=cap)
    return Scheduler(config, BlockManager(num_blocks, 16), max_model_len=4096)


def step(sched):
    """One step as the capacity model drives it: {request id: tokens scheduled}."""
    out = sched.schedule()
    sched.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.needs_sample})
    sched.block_manager.check_integrity()
    return {s.request_id: s.num_new_tokens for s in out.scheduled}


def light_decoding(sched):
    """A light tenant's request, past its first step (decoding: the light tenant has a live request)."""
    light = make("light", 8, 64)
    sched.add_request(light)
    step(sched)
    assert light.output_token_ids
    return light


def whale_cluster(sched, n=4):
    """n whale documents arriving at once (its four gateway slots ending together), after the whale was
    served more than the light tenant."""
    sched.policy.counters["whale"] = sched.policy.counters.get("light", 0.0) + 1000.0
    docs = [make("whale", DOC, 8) for _ in range(n)]
    for d in docs:
        sched.add_request(d)
    return docs


@pytest.mark.parametrize("cap", [CAP, 0])
def test_whale_documents_go_in_steps_of_at_most_the_cap(cap):
    sched = scheduler(cap)
    light_decoding(sched)
    docs = whale_cluster(sched)
    steps = []
    while any(d.num_computed_tokens < DOC for d in docs):
        before = sum(min(d.num_computed_tokens, DOC) for d in docs)
        step(sched)
        steps.append(sum(min(d.num_computed_tokens, DOC) for d in docs) - before)  # prompt tokens only
        assert len(steps) < 50
    if cap:
        assert max(steps) <= CAP and sum(steps) == 4 * DOC
        assert len(steps) == 8  # one document at a time, two steps each (128 + 122)
        assert sched.num_share_capped_total > 0
    else:  # the config at aab412d: all four documents in the first step, 1,000 prompt tokens at once
        assert steps[0] == 4 * DOC and len(steps) == 1


@pytest.mark.parametrize("cap", [CAP, 0])
@pytest.mark.parametrize("when", ["with the cluster", "mid-cluster"])
def test_light_first_step_holds_no_whale_prompt(cap, when):
    sched = scheduler(cap)
    light_decoding(sched)
    newcomer = make("light2", 8)  # another light tenant's question
    if when == "with the cluster":  # just ahead of it
        sched.add_request(newcomer)
    docs = whale_cluster(sched)
    if when == "mid-cluster":
        step(sched)  # the whales' documents start (with the cap: the first of them)
        sched.add_request(newcomer)
    assert sched.policy.counters["light2"] <= sched.policy.counters["whale"]  # the VTC lift
    before = sum(min(d.num_computed_tokens, DOC) for d in docs)
    first = step(sched)
    assert first[newcomer.request_id] == 8 and newcomer.output_token_ids
    whale_prompt = sum(min(d.num_computed_tokens, DOC) for d in docs) - before
    if cap:
        assert whale_prompt == 0  # running and waiting documents (under the threshold) yielded the step
        step(sched)  # then they go on
        assert 0 < sum(min(d.num_computed_tokens, DOC) for d in docs) - before <= CAP
    else:  # the config at aab412d: every document not yet prefilled shares the light request's first step
        assert whale_prompt == (4 * DOC if when == "with the cluster" else 0)
        assert sched.num_prefill_yields_total == 0


def test_without_the_cap_mid_cluster_documents_are_done_in_the_first_step():
    """The mid-cluster case above without the cap: nothing left to yield, all 1,000 tokens went in one step
    (the step in flight when the light request arrives)."""
    sched = scheduler(0)
    light_decoding(sched)
    docs = whale_cluster(sched)
    scheduled = step(sched)
    assert sum(scheduled[d.request_id] for d in docs) == 4 * DOC


def test_a_tenant_alone_is_not_capped():
    sched = scheduler()
    docs = [make("whale", DOC, 8) for _ in range(4)]
    for d in docs:
        sched.add_request(d)
    assert step(sched) == {d.request_id: DOC for d in docs}  # no other tenant: the whole budget


def test_the_least_served_tenant_is_not_capped():
    sched = scheduler()
    light_decoding(sched)
    sched.policy.counters["light"] = 5000.0  # the light tenant served more: the whale is at the floor
    docs = [make("whale", DOC, 8) for _ in range(4)]
    for d in docs:
        sched.add_request(d)
    assert sched.policy.counters["whale"] < sched.policy.counters["light"]
    scheduled = step(sched)
    assert sum(scheduled[d.request_id] for d in docs) == 4 * DOC


def test_prompts_within_the_cap_are_not_capped_whatever_the_counter():
    """A busy light tenant above the floor (its counter over the whale's too): its questions are admitted in
    the step they arrive, next to a whale document holding the cap, and take none of it."""
    sched = scheduler()
    light_decoding(sched)
    docs = whale_cluster(sched, 1)
    step(sched)
    assert 0 < docs[0].num_computed_tokens < DOC
    sched.policy.counters["busy"] = sched.policy.counters["whale"] + 500.0
    questions = [make("busy", 36) for _ in range(4)]
    for q in questions:
        sched.add_request(q)
    scheduled = step(sched)
    assert all(scheduled[q.request_id] == 36 for q in questions)
    assert scheduled[docs[0].request_id] == DOC - CAP  # the rest of the document, within the cap


def test_one_large_over_share_prompt_starts_at_a_time():
    """A waiting large prompt of an over-share tenant does not start with a sliver while another is mid-prefill
    (each would hold a partial-prefill slot a light request needs)."""
    sched = scheduler(cap=100)
    light_decoding(sched)
    docs = whale_cluster(sched, 3)
    for _ in range(2):
        step(sched)
        started = [d for d in docs if d.num_computed_tokens > 0]
        assert len(started) == 1 and started[0] is docs[0]


def test_config_needs_fair_and_chunked_prefill():
    with pytest.raises(ValueError, match="over_share_prefill_tokens"):
        SchedulerConfig(scheduling_policy="fcfs", over_share_prefill_tokens=64)
    with pytest.raises(ValueError):
        SchedulerConfig(scheduling_policy="fair", over_share_prefill_tokens=-1)
    assert SchedulerConfig(scheduling_policy="fair", over_share_prefill_tokens=64).over_share_prefill_tokens == 64


@pytest.mark.parametrize("seed", range(4))
def test_vtc_bound_holds_with_the_cap(seed):
    """Four backlogged tenants with long and short prompts, the cap on: the service gap between any two
    backlogged tenants stays within 2 x max(wp x max input, wq x max_num_seqs x max output)."""
    rng = random.Random(seed)
    seqs, max_in, max_out = 8, 300, 8
    sched = scheduler(cap=64, budget=256, threshold=48, max_num_seqs=seqs)
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
    assert sched.num_share_capped_total > 0
