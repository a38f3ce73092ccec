"""Automatic prefix caching: greedy output with caching on equals caching off, salts isolate tenants,
and block accounting stays consistent under random interleavings."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
SHARED = ("You are a meticulous assistant for the platform team. Answer with care, cite the runbook section, "
          "and never guess a number you cannot see in the context below.\n")
SUFFIXES = ["How do I restart the scheduler?", "What does KV cache usage mean?", "Why is TTFT high today?",
            "Summarise the incident in one line."]


def make(caching: bool, **kw) -> LLM:
    kw.setdefault("max_model_len", 512)
    kw.setdefault("kv_cache_memory", 64 * 2**20)
    return LLM(enable_prefix_caching=caching, **kw)


def ids_of(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def pair():
    return make(True), make(False)


@pytest.fixture(scope="module")
def tok(pair):
    return pair[0].get_tokenizer()


def prompts_shared(tok):
    return [tok.encode(SHARED + s) for s in SUFFIXES]


def test_shared_prefix_batches(pair, tok):
    on, off = pair
    prompts = prompts_shared(tok)
    expected = ids_of(off.generate(prompts, GREEDY, use_tqdm=False))
    first = on.generate(prompts, GREEDY, use_tqdm=False)  # same step: one computes, the others wait
    assert ids_of(first) == expected
    again = on.generate(prompts, GREEDY, use_tqdm=False)  # now served from the cache
    assert ids_of(again) == expected
    assert all(o.num_cached_tokens >= 16 * (len(tok.encode(SHARED)) // 16) for o in again)
    on.engine.block_manager.check_integrity()


@pytest.mark.parametrize("length", [32, 48, 64])
def test_prompts_that_are_exact_block_multiples(pair, tok, length):
    on, off = pair
    ids = tok.encode(" ".join(["the quick brown fox"] * 40))[:length]
    expected = ids_of(off.generate([ids], GREEDY, use_tqdm=False))
    assert ids_of(on.generate([ids], GREEDY, use_tqdm=False)) == expected
    hit = on.generate([ids], GREEDY, use_tqdm=False)
    assert ids_of(hit) == expected
    assert hit[0].num_cached_tokens == length - 16  # the last block is recomputed to produce logits


def test_two_requests_with_same_prefix_in_same_step(tok):
    on, off = make(True), make(False)
    prompts = [tok.encode(SHARED + "First question?"), tok.encode(SHARED + "Second one?")]
    expected = ids_of(off.generate(prompts, GREEDY, use_tqdm=False))
    engine = on.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, GREEDY)
    first = engine.scheduler.schedule()
    # only one computes the shared prefix; the other waits for it and then hits it
    assert [s.request_id for s in first.scheduled] == ["r0"]
    assert engine.scheduler.waiting[0].request_id == "r1"
    engine.runner.execute(first)
    engine.scheduler.update_from_output(first, {"r0": [0]}, 0.0)
    engine.abort_request(["r0", "r1"])
    assert ids_of(on.generate(prompts, GREEDY, use_tqdm=False)) == expected


def test_after_evictions(tok):
    on, off = make(True, num_gpu_blocks_override=48, max_model_len=256), make(False, max_model_len=256)
    prompts = prompts_shared(tok)
    expected = ids_of(off.generate(prompts, GREEDY, use_tqdm=False))
    assert ids_of(on.generate(prompts, GREEDY, use_tqdm=False)) == expected
    flood = [tok.encode(f"Unrelated prompt number {i} about gardening, cooking and rivers.") * 3 for i in range(12)]
    on.generate(flood, GREEDY, use_tqdm=False)  # forces evictions of the cached prefix blocks
    assert ids_of(on.generate(prompts, GREEDY, use_tqdm=False)) == expected
    on.engine.block_manager.check_integrity()


def test_after_preemption(tok):
    kw = {"num_gpu_blocks_override": 12, "max_model_len": 160}
    on, off = make(True, **kw), make(False, **kw)
    prompts = prompts_shared(tok)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = ids_of(off.generate(prompts, params, use_tqdm=False))
    got = ids_of(on.generate(prompts, params, use_tqdm=False))
    assert on.engine.scheduler.num_preemptions_total > 0
    assert got == expected


def test_with_chunked_prefill(tok):
    kw = {"max_num_batched_tokens": 32, "max_model_len": 256}
    on, off = make(True, **kw), make(False, **kw)
    prompts = prompts_shared(tok)
    expected = ids_of(off.generate(prompts, GREEDY, use_tqdm=False))
    assert ids_of(on.generate(prompts, GREEDY, use_tqdm=False)) == expected
    assert ids_of(on.generate(prompts[::-1], GREEDY, use_tqdm=False)) == expected[::-1]


def test_cache_salt_isolates(pair, tok):
    on, _ = pair
    ids = tok.encode(SHARED * 2 + "Salted question?")
    a1 = on.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], GREEDY, use_tqdm=False)[0]
    b1 = on.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-b"}], GREEDY, use_tqdm=False)[0]
    a2 = on.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], GREEDY, use_tqdm=False)[0]
    assert b1.num_cached_tokens == 0
    assert a2.num_cached_tokens > 0
    assert a1.outputs[0].token_ids == b1.outputs[0].token_ids == a2.outputs[0].token_ids


def test_prefix_metrics_count_tokens(tok):
    on = make(True)
    prompts = prompts_shared(tok)
    on.generate(prompts, GREEDY, use_tqdm=False)
    sched = on.engine.scheduler
    assert sched.prefix_cache_queries == sum(map(len, prompts))
    assert 0 < sched.prefix_cache_hits < sched.prefix_cache_queries


# ---- property-based: random arrivals, finishes, aborts and evictions ------------------------------------
PREFIXES = [[3 + (i * 7) % 100 for i in range(n)] for n in (8, 16, 24, 40)]
events = st.lists(st.tuples(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(1, 12), st.integers(1, 2)), max_size=3),
    st.lists(st.integers(0, 50), max_size=2)), min_size=1, max_size=25)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return LLM(str(tiny_model_dir), load_format="dummy", num_gpu_blocks_override=20, block_size=8,
               max_model_len=96, max_num_batched_tokens=40, max_num_seqs=5, enable_prefix_caching=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events, policy=st.sampled_from(["lru", "cost"]))
def test_refcounts_stay_consistent(tiny, events, policy):
    from shared_engine.core.eviction import make_policy

    engine = tiny.engine
    bm = engine.block_manager
    assert not bm.block_tables
    bm._evictable = make_policy(policy, block_size=bm.block_size)  # fresh policy, empty cache
    bm.reset_prefix_cache()
    bm._cached.clear()
    bm._block_hash = [None] * bm.num_blocks
    bm._free = type(bm._free)(range(bm.num_blocks))
    live, counter = [], 0
    for new, aborts in events:
        for prefix, suffix_len, max_tokens, n in new:
            counter += 1
            prompt = PREFIXES[prefix] + [50 + (counter + i) % 60 for i in range(suffix_len)]
            engine.add_request(f"q{counter}", prompt, SamplingParams(temperature=0.0, n=n, max_tokens=max_tokens,
                                                                      ignore_eos=True))
            live.append(f"q{counter}")
        for selector in aborts:
            if live:
                engine.abort_request(live.pop(selector % len(live)))
        for output in engine.step():
            if output.finished:
                live.remove(output.request_id)
        bm.check_integrity()
    while engine.has_unfinished_requests():
        engine.step()
        bm.check_integrity()
    assert all(r == 0 for r in bm.ref_counts)
    assert bm.num_free_blocks == bm.num_blocks  # every block free or evictable


def test_property_run_hit_and_evicted(tiny):
    sched = tiny.engine.scheduler
    assert sched.prefix_cache_hits > 0
