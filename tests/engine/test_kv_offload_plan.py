"""KV offload's decisions (`--kv-offload-size`), torch-free: evicted cached blocks go to the host tier, a GPU
miss that hits the host tier gets a new GPU block and a queued restore, a step never reuses a host slot that it
reads or writes, and at 1.5x oversubscription of the GPU pool agent sessions recompute almost nothing (counted)
where plain LRU recomputes most of their history."""

from __future__ import annotations

import argparse

import pytest

from shared_engine.config import CacheConfig, SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.host_kv_tier import HostKVTier
from shared_engine.core.request import Request
from shared_engine.core.scheduler import Scheduler
from shared_engine.entrypoints.openai.cli_args import add_serve_arguments, build_configs
from shared_engine.sampling_params import SamplingParams

BS = 4


def make(rid: str, tokens: list[int], max_tokens: int = 2) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens)


def compute(bm: BlockManager, request: Request) -> list[int]:
    """Allocate the whole prompt (taking its cached prefix), mark it computed and registered, free it."""
    hit = bm.find_cached_prefix(request)
    bm.allocate(request, request.num_tokens - hit.num_blocks * BS, cached_blocks=hit)
    request.num_computed_tokens = request.num_tokens
    bm.cache_computed_blocks(request)
    blocks = list(bm.block_tables[request.request_id])
    bm.free(request)
    bm.check_integrity()
    return blocks


def test_evicted_blocks_are_offloaded_then_restored_with_copies_in_order():
    bm = BlockManager(8, BS, enable_prefix_caching=True, num_host_blocks=16)
    session = list(range(100, 113))  # 13 tokens: 3 full blocks + 1
    first = compute(bm, make("a", session))
    assert bm.take_copies() == ([], [])  # nothing evicted yet
    compute(bm, make("b", list(range(500, 532))))  # 8 blocks: evicts all of a's cached blocks
    offloads, restores = bm.take_copies()
    assert sorted(b for b, _ in offloads) == sorted(first[:3]) and restores == []
    assert bm.num_host_cached_blocks == 3 and bm.num_offloaded_blocks_total == 3
    turn2 = make("a2", session + [7, 8, 9])
    hit = bm.find_cached_prefix(turn2)
    assert len(hit) == 0 and len(hit.host_hashes) == 3 and hit.num_blocks == 3
    assert bm.can_allocate(turn2, turn2.num_tokens - 3 * BS, cached_blocks=hit)
    bm.allocate(turn2, turn2.num_tokens - 3 * BS, cached_blocks=hit)
    offloads, restores = bm.take_copies()
    table = bm.block_tables["a2"]
    slot_of = {b: s for b, s in offloads}  # b's blocks evicted now went to the host as well
    assert [g for _, g in restores] == table[:3]  # root first, into the request's first 3 blocks
    assert not {s for s, _ in restores} & set(slot_of.values())  # no slot read and written in one step
    assert bm.num_restored_blocks_total == 3
    assert len(bm.find_cached_prefix(make("probe", session + [1]))) == 3  # registered on the GPU at once
    bm.check_integrity()
    bm.free(turn2)
    bm.check_integrity()
    assert bm.num_free_blocks == bm.num_blocks


def test_host_slots_a_step_reads_or_writes_are_not_reused_in_it():
    tier = HostKVTier(2)
    a, b = tier.offer(b"a"), tier.offer(b"b")
    assert {a, b} == {0, 1} and tier.offer(b"c") is None  # both written this step: the third is dropped
    tier.end_step()
    assert tier.claim(b"a") == a  # a restore reads a this step
    assert tier.offer(b"c") == b  # so c takes b's slot (the least recently used one not busy)
    assert tier.offer(b"d") is None and b"a" in tier and b"b" not in tier
    tier.end_step()
    assert tier.offer(b"a") is None  # already there: touched, no second copy
    tier.check_integrity()
    tier.clear()
    assert len(tier) == 0
    tier.check_integrity()


def test_a_restored_block_evicted_again_needs_no_second_copy():
    bm = BlockManager(4, BS, enable_prefix_caching=True, num_host_blocks=8)
    compute(bm, make("a", list(range(100, 109))))  # 2 full blocks
    compute(bm, make("b", list(range(200, 216))))  # evicts them: 2 offloads
    bm.take_copies()
    compute(bm, make("a2", list(range(100, 109)) + [1, 2]))  # restores them (and offloads b's 2)
    bm.take_copies()
    before = bm.num_offloaded_blocks_total
    compute(bm, make("c", list(range(300, 316))))  # evicts a's restored blocks again
    offloads, _ = bm.take_copies()
    assert bm.num_offloaded_blocks_total - before == len(offloads) <= 2  # b's blocks maybe; a's are on the host
    assert len(bm.find_cached_prefix(make("a3", list(range(100, 109)) + [5])).host_hashes) == 2
    bm.reset_prefix_cache()  # forgets the host tier too
    assert bm.num_host_cached_blocks == 0 and bm.find_cached_prefix(make("a4", list(range(100, 109)))) == []
    bm.check_integrity()


# ---- 1.5x oversubscription of the GPU pool, agent sessions ------------------------------------------
SESSIONS, TURNS, NEW, OUT, FIRST = 6, 6, 24, 8, 57  # FIRST + OUT = 1 mod 16: every computed block is full
POOL = 56  # blocks of 16: the sessions' final KV (6 x 14 blocks = 84) is 1.5x the pool


def run_sessions(num_host_blocks: int) -> tuple[int, int, Scheduler]:
    """Round-robin turns (one at a time, to completion), each resending its session's history (prompt and
    outputs) plus NEW tokens. Returns (tokens computed before and computed again, prompt tokens)."""
    bm = BlockManager(POOL, 16, enable_prefix_caching=True, num_host_blocks=num_host_blocks)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=512), bm, max_model_len=1024)
    history = {s: [10_000 * (s + 1) + i for i in range(FIRST)] for s in range(SESSIONS)}
    recomputed = prompt_tokens = 0
    for turn in range(TURNS):
        for s in range(SESSIONS):
            request = make(f"s{s}t{turn}", history[s], max_tokens=OUT)
            sched.add_request(request)
            while not request.is_finished:
                out = sched.schedule()
                assert not out.preempted_request_ids
                sched.update_from_output(out, {i.request_id: [turn + 3] for i in out.scheduled if i.needs_sample})
                bm.check_integrity()
            prompt_tokens += request.num_prompt_tokens
            if turn:
                computed_before = request.num_prompt_tokens - NEW - 1  # the last output was never an input
                recomputed += computed_before - min(request.num_cached_tokens, computed_before)
            history[s] = history[s] + request.output_token_ids + [20_000 * (s + 1) + 100 * turn + i
                                                                   for i in range(NEW)]
    return recomputed, prompt_tokens, sched


def test_oversubscribed_sessions_recompute_little_with_offload():
    """Counted on this workload: with offload 0 of 4,932 prompt tokens are recomputed (122 blocks restored);
    plain LRU (no host tier) recomputes 1,952 (39.6%), all in the later turns once the sessions outgrow the pool."""
    recomputed, prompt_tokens, sched = run_sessions(num_host_blocks=64)
    lru_recomputed, lru_prompt_tokens, _ = run_sessions(num_host_blocks=0)
    assert prompt_tokens == lru_prompt_tokens == 4932
    assert lru_recomputed > 0.25 * prompt_tokens  # the pool really is oversubscribed
    assert recomputed <= 0.02 * prompt_tokens
    bm = sched.block_manager
    assert bm.num_restored_blocks_total > 0 and sched.host_prefix_cache_hits == 16 * bm.num_restored_blocks_total


def test_flag_yaml_and_validation(tmp_path):
    (tmp_path / "c.yaml").write_text("kv-offload-size: 0.5\n")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    engine, _ = build_configs(parser.parse_args(["--config", str(tmp_path / "c.yaml")]))
    assert engine.cache.kv_offload_size == 0.5
    engine, _ = build_configs(parser.parse_args(["--kv-offload-size", "2"]))
    assert engine.cache.num_host_blocks(2 * 1024**2) == 1024  # 2 GiB of 2 MiB blocks (llama-3.1-8b, bf16)
    assert CacheConfig().num_host_blocks(1024) == 0  # off by default
    with pytest.raises(ValueError, match="kv_offload_size must be >= 0.0 and <= 4096.0"):
        CacheConfig(kv_offload_size=-1)
    with pytest.raises(ValueError, match="kv_offload_size needs enable_prefix_caching"):
        CacheConfig(kv_offload_size=2, enable_prefix_caching=False)
