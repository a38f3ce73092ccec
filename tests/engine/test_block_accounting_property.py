"""Property-based: random arrivals, lengths and aborts keep block accounting consistent at every step, and
every block is free once all requests end (tiny dummy-weight model, so thousands of steps run fast)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_engine import LLM, SamplingParams

# one event per engine step: (new requests [(prompt_len, max_tokens, n)], abort selectors)
events = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(1, 120), st.integers(1, 40), st.integers(1, 3)), max_size=3),
        st.lists(st.integers(0, 50), max_size=2),
    ),
    min_size=1,
    max_size=30,
)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    # 24 blocks of 8 tokens: small enough that preemption happens often
    return LLM(str(tiny_model_dir), load_format="dummy", num_gpu_blocks_override=24, block_size=8,
               max_model_len=160, max_num_batched_tokens=48, max_num_seqs=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events, seed=st.integers(0, 1000))
def test_integrity_after_every_step(llm, events, seed):
    engine = llm.engine
    bm = engine.block_manager
    live: list[str] = []
    counter = 0
    for new, aborts in events:
        for prompt_len, max_tokens, n in new:
            request_id = f"r{counter}"
            counter += 1
            prompt = [(seed + 7 * i + counter) % 120 + 3 for i in range(prompt_len)]
            engine.add_request(request_id, prompt, SamplingParams(temperature=1.0, seed=seed, n=n,
                                                                  max_tokens=max_tokens, ignore_eos=True))
            live.append(request_id)
        for selector in aborts:
            if live:
                engine.abort_request(live.pop(selector % len(live)))
        for output in engine.step():
            if output.finished:
                live.remove(output.request_id)
                for choice in output.outputs:
                    assert choice.finish_reason == "length"
        bm.check_integrity()
        assert engine.scheduler.num_running <= 6
    while engine.has_unfinished_requests():
        engine.step()
        bm.check_integrity()
    assert bm.num_free_blocks == bm.num_blocks
    assert not bm.block_tables


def test_property_run_exercised_preemption(llm):
    """The random runs above must actually have hit the preemption path (runs after them in this module)."""
    assert llm.engine.scheduler.num_preemptions_total > 0


# ---- with adapter churn (multi-LoRA) -----------------------------------------------------------------
# one event per step: new requests [(prompt_len, max_tokens, adapter: 0 base, 1-4 adapters)], aborts,
# and reloads (adapter names re-registered under a new id: a new version of the same name)
lora_events = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30), st.integers(0, 4)), max_size=3),
        st.lists(st.integers(0, 50), max_size=2),
        st.lists(st.integers(1, 4), max_size=1),
    ),
    min_size=1,
    max_size=25,
)


@pytest.fixture(scope="module")
def lora_llm(tiny_model_dir, tmp_path_factory):
    from shared_engine.lora.adapter_factory import write_random_adapter
    from shared_engine.model_arch import ModelArch

    arch = ModelArch.from_dir(tiny_model_dir)
    root = tmp_path_factory.mktemp("tiny-adapters")
    dirs = [write_random_adapter(root / f"a{i}", arch, rank=[2, 4, 8, 4][i], seed=i,
                                 target_modules=[["q_proj", "v_proj"], ["o_proj"], ["gate_proj", "down_proj"],
                                                 ["k_proj", "up_proj"]][i]) for i in range(4)]
    llm = LLM(str(tiny_model_dir), load_format="dummy", num_gpu_blocks_override=24, block_size=8, max_model_len=160,
              max_num_batched_tokens=48, max_num_seqs=6, enable_lora=True, max_loras=2, max_cpu_loras=2,
              max_lora_rank=8)
    return llm, dirs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=lora_events, seed=st.integers(0, 1000))
def test_integrity_with_adapter_churn(lora_llm, events, seed):
    """Block integrity after every step, and the slot invariants: at most max_loras adapters among running
    requests, each running request's adapter in a GPU slot, and nothing pinned once all requests end."""
    from shared_engine.lora import LoRARequest

    llm, dirs = lora_llm
    engine = llm.engine
    bm, manager = engine.block_manager, engine.runner.lora
    versions = dict.fromkeys(range(1, 5), 0)
    live: list[str] = []
    counter = 0
    for new, aborts, reloads in events:
        for name in reloads:
            versions[name] += 1
        for prompt_len, max_tokens, adapter in new:
            request_id = f"l{counter}"
            counter += 1
            lora = None if adapter == 0 else LoRARequest(f"a{adapter}", 100 * adapter + versions[adapter] + 1,
                                                         str(dirs[adapter - 1]))
            prompt = [(seed + 5 * i + counter) % 120 + 3 for i in range(prompt_len)]
            engine.add_request(request_id, prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                                                                  ignore_eos=True), lora_request=lora)
            live.append(request_id)
        for selector in aborts:
            if live:
                engine.abort_request(live.pop(selector % len(live)))
        for output in engine.step():
            if output.finished:
                live.remove(output.request_id)
        bm.check_integrity()
        running = [r for r in engine.scheduler.running if r.lora_request is not None]
        assert len({r.lora_key for r in running}) <= 2
        slots = set(manager.slot_keys)
        assert all(r.lora_request.cache_key in slots for r in running if r.num_computed_tokens > 0)
    while engine.has_unfinished_requests():
        engine.step()
        bm.check_integrity()
    assert bm.num_free_blocks == bm.num_blocks
    assert not manager._users and len(manager.cpu_keys) <= 2


# ---- with session pins (Continuum's KV time-to-live) -------------------------------------------------
# one event per step: new requests [(session 0-3, prompt_len, max_tokens)], aborts; a session's prompts
# share its tokens, so its turns hit each other's pinned prefixes
pin_events = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 3), st.integers(1, 100), st.integers(1, 20)), max_size=3),
        st.lists(st.integers(0, 50), max_size=1),
    ),
    min_size=1,
    max_size=25,
)


_MOST_PINNED = [0]  # across the runs below, for the check that they pinned at all


@pytest.fixture(scope="module")
def pin_llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), load_format="dummy", num_gpu_blocks_override=24, block_size=8,
               max_model_len=160, max_num_batched_tokens=48, max_num_seqs=6, session_pin_ttl=3600.0,
               max_pinned_blocks=10)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=pin_events, seed=st.integers(0, 1000))
def test_integrity_with_session_pins(pin_llm, events, seed):
    """Integrity after every step with pins held across requests, the cap never exceeded, and 0 leaked
    blocks: once every request ended and the pins expire, every block is free."""
    engine = pin_llm.engine
    bm = engine.block_manager
    live: list[str] = []
    counter = 0
    for new, aborts in events:
        for session, prompt_len, max_tokens in new:
            request_id = f"s{counter}"
            counter += 1
            prompt = [(seed + 11 * session + 3 * i) % 120 + 3 for i in range(prompt_len)]
            engine.add_request(request_id, prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                                                                  ignore_eos=True), session_id=f"sess{session}")
            live.append(request_id)
        for selector in aborts:
            if live:
                engine.abort_request(live.pop(selector % len(live)))
        for output in engine.step():
            if output.finished:
                live.remove(output.request_id)
        bm.check_integrity()
        assert bm.num_pinned_blocks <= 10
        _MOST_PINNED[0] = max(_MOST_PINNED[0], bm.num_pinned_blocks)
    while engine.has_unfinished_requests():
        engine.step()
        bm.check_integrity()
    assert not bm.block_tables
    bm.expire_pins(float("inf"))
    bm.check_integrity()
    assert bm.num_pinned_blocks == 0 and bm.num_free_blocks == bm.num_blocks


def test_pin_run_exercised_pins(pin_llm):
    """The random runs above must have pinned prefixes and reused cached ones (runs after them)."""
    assert _MOST_PINNED[0] > 0 and pin_llm.engine.scheduler.prefix_cache_hits > 0


# ---- with session pins and KV offload (a host tier smaller than the pool's churn) ---------------------
_OFFLOAD_SEEN = {"offloaded": 0, "restored": 0, "host_full": False}
HOST_BLOCKS = 16


@pytest.fixture(scope="module")
def offload_llm(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), load_format="dummy", num_gpu_blocks_override=24, block_size=8,
              max_model_len=160, max_num_batched_tokens=48, max_num_seqs=6, session_pin_ttl=3600.0,
              max_pinned_blocks=10, kv_offload_size=HOST_BLOCKS * 4096 / 1024**3)  # 4 KiB blocks (fp32)
    assert llm.engine.block_manager.host.num_blocks == HOST_BLOCKS
    return llm


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=pin_events, seed=st.integers(0, 1000))
def test_integrity_with_session_pins_and_offload(offload_llm, events, seed):
    """Integrity after every step of both tiers (GPU pool, host tier) with pins held and blocks offloaded and
    restored; every copy a step queues is handed to that step; 0 leaked blocks in either tier at the end."""
    engine = offload_llm.engine
    bm = engine.block_manager
    live: list[str] = []
    counter = 0
    for new, aborts in events:
        for session, prompt_len, max_tokens in new:
            request_id = f"o{counter}"
            counter += 1
            prompt = [(seed + 13 * session + 5 * i) % 120 + 3 for i in range(prompt_len)]
            engine.add_request(request_id, prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                                                                  ignore_eos=True), session_id=f"sess{session}")
            live.append(request_id)
        for selector in aborts:
            if live:
                engine.abort_request(live.pop(selector % len(live)))
        for output in engine.step():
            if output.finished:
                live.remove(output.request_id)
        bm.check_integrity()
        assert bm.take_copies() == ([], [])  # nothing queued outside a step
        assert bm.num_pinned_blocks <= 10 and len(bm.host) <= HOST_BLOCKS
        _OFFLOAD_SEEN["host_full"] |= len(bm.host) == HOST_BLOCKS
    while engine.has_unfinished_requests():
        engine.step()
        bm.check_integrity()
    assert not bm.block_tables
    bm.expire_pins(float("inf"))
    bm.check_integrity()
    assert bm.num_pinned_blocks == 0 and bm.num_free_blocks == bm.num_blocks
    assert len(bm.host) + len(bm.host._free) == HOST_BLOCKS  # no host slot leaked (check_integrity checks it too)
    _OFFLOAD_SEEN["offloaded"] = bm.num_offloaded_blocks_total
    _OFFLOAD_SEEN["restored"] = bm.num_restored_blocks_total


def test_offload_run_exercised_both_directions(offload_llm):
    """The random runs above must have offloaded, filled the host tier (so its LRU replaced entries) and
    restored blocks on prefix hits (runs after them)."""
    assert _OFFLOAD_SEEN["offloaded"] > HOST_BLOCKS and _OFFLOAD_SEEN["restored"] > 0 and _OFFLOAD_SEEN["host_full"]
    assert offload_llm.engine.scheduler.host_prefix_cache_hits > 0
