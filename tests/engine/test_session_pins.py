"""Session pins (`--session-pin-ttl`, `--max-pinned-blocks`; Continuum's KV time-to-live): a finished turn's
cached prefix survives pool pressure until its TTL (simulated seconds passed in), is then evictable, is
unpinned by the session's next turn, and the cap releases the oldest pin. Torch-free."""

from __future__ import annotations

import argparse

import pytest

from shared_engine.config import CacheConfig, SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request
from shared_engine.core.scheduler import Scheduler
from shared_engine.entrypoints.openai.cli_args import add_serve_arguments, build_configs
from shared_engine.sampling_params import SamplingParams

BS = 4


def make(rid: str, tokens: list[int], session_id: str | None = None, max_tokens: int = 2) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens,
                   session_id=session_id)


def finish_turn(bm: BlockManager, request: Request, now: float | None) -> None:
    """Allocate and compute the whole prompt, register its blocks, then free it (pinning with `now`)."""
    bm.allocate(request, request.num_tokens, cached_blocks=bm.find_cached_prefix(request))
    request.num_computed_tokens = request.num_tokens
    bm.cache_computed_blocks(request)
    bm.free(request, now)


def pressure(bm: BlockManager, tag: int) -> None:
    """Fill every free block with one-off prompts (each forces evictions), then end them."""
    others = []
    while bm.num_free_blocks >= 2:
        r = make(f"p{tag}-{len(others)}", [1000 * tag + 10 * len(others) + i for i in range(2 * BS)])
        bm.allocate(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        bm.cache_computed_blocks(r)
        others.append(r)
        bm.check_integrity()
    for r in others:
        bm.free(r)
    bm.check_integrity()


SESSION = list(range(100, 117))  # 17 tokens: 4 full blocks


@pytest.mark.parametrize("ttl, survives", [(5.0, True), (0.0, False)])
def test_pinned_prefix_survives_pressure_until_ttl(ttl, survives):
    bm = BlockManager(16, BS, enable_prefix_caching=True, pin_ttl=ttl)
    finish_turn(bm, make("t1", SESSION, "s"), now=0.0)
    assert bm.num_pinned_blocks == (4 if survives else 0)
    for tag, now in enumerate([1.0, 2.0, 4.9]):
        bm.expire_pins(now)
        pressure(bm, tag + 1)  # the reference run (ttl 0) shows this pressure evicts an unpinned prefix
        assert len(bm.find_cached_prefix(make("t2", SESSION + [5, 6], "s"))) == (4 if survives else 0)
    bm.expire_pins(5.0)  # the TTL ends: the blocks are evictable (still cached, counted as free)
    assert bm.num_pinned_blocks == 0 and bm.num_free_blocks == bm.num_blocks
    assert len(bm.find_cached_prefix(make("t2", SESSION + [5, 6], "s"))) == (4 if survives else 0)
    pressure(bm, 9)
    assert bm.find_cached_prefix(make("t2", SESSION + [5, 6], "s")) == []
    bm.check_integrity()


def test_next_turn_unpins_and_cap_releases_the_oldest():
    bm = BlockManager(32, BS, enable_prefix_caching=True, pin_ttl=60.0, max_pinned_blocks=6)
    finish_turn(bm, make("a1", SESSION, "a"), now=0.0)
    finish_turn(bm, make("b1", [200 + i for i in range(13)], "b"), now=1.0)  # 3 blocks: a's 4 must go
    assert bm.num_pinned_blocks == 3
    assert bm.pins.pop_oldest() is not None and not bm.pins  # only b's pin was left
    bm = BlockManager(32, BS, enable_prefix_caching=True, pin_ttl=60.0)
    finish_turn(bm, make("a1", SESSION, "a"), now=0.0)
    turn2 = make("a2", SESSION + [7, 8, 9], "a")
    cached = bm.find_cached_prefix(turn2)
    assert len(cached) == 4
    bm.allocate(turn2, turn2.num_tokens - 4 * BS, cached_blocks=cached)
    assert bm.num_pinned_blocks == 0 and all(bm.ref_counts[b] == 1 for b in cached)  # the turn holds them now
    bm.check_integrity()
    bm.free(turn2)  # aborted or preempted (no `now`): no pin
    assert bm.num_pinned_blocks == 0 and bm.num_free_blocks == bm.num_blocks
    bm.check_integrity()


def run_steps(sched: Scheduler, start: float, steps: int, arrivals=None) -> float:
    now = start
    for _ in range(steps):
        for request in (arrivals or {}).get(now, []):
            sched.add_request(request)
        out = sched.schedule(now)
        sched.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.needs_sample}, now)
        sched.block_manager.check_integrity()
        now += 1.0
    return now


@pytest.mark.parametrize("ttl, expected_hit", [(30.0, 64), (0.0, 0)])
def test_scheduler_next_turn_hits_the_pinned_prefix_after_a_tool_pause(ttl, expected_hit):
    """Simulated seconds: the turn ends, one-off requests flood the pool during a 10 s tool pause, the next
    turn (the session + 3 tokens) still finds its 64-token prefix; without pins LRU evicted it."""
    bm = BlockManager(64, BS, enable_prefix_caching=True, pin_ttl=ttl)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), bm, max_model_len=256)
    session = list(range(300, 365))  # 65 tokens: 16 full blocks
    now = run_steps(sched, 0.0, 4, {0.0: [make("turn1", session, "s")]})
    flood = {now + i: [make(f"x{i}", [2000 + 50 * i + j for j in range(60)])] for i in range(10)}
    now = run_steps(sched, now, 10, flood)
    turn2 = make("turn2", session + [1, 2, 3], "s")
    run_steps(sched, now, 4, {now: [turn2]})
    assert turn2.is_finished and sched.num_preemptions_total == 0
    assert turn2.num_cached_tokens == expected_hit
    assert bm.num_pinned_blocks == (17 if ttl else 0)  # turn2's own prefix, pinned in turn
    sched.schedule(now + 100.0)  # past every TTL: nothing pinned, nothing held
    assert bm.num_pinned_blocks == 0 and bm.num_free_blocks == bm.num_blocks


def test_pins_give_way_when_nothing_runs():
    """With no clock (`now` None, time never advances), a request that needs the pinned blocks is still
    admitted: pins are released oldest first instead of stalling an idle engine."""
    bm = BlockManager(8, BS, enable_prefix_caching=True, pin_ttl=1e6, max_pinned_blocks=8)
    finish_turn(bm, make("a", list(range(100, 113)), "a"), now=0.0)
    finish_turn(bm, make("b", list(range(200, 213)), "b"), now=0.0)
    assert bm.num_pinned_blocks == 6
    sched = Scheduler(SchedulerConfig(), bm, max_model_len=64)
    big = make("big", list(range(500, 528)))  # 7 blocks
    run_steps(sched, 0.0, 1, {0.0: [big]})
    assert big.num_computed_tokens == 28 and bm.num_pinned_blocks <= 1


@pytest.mark.parametrize("settings, message", [
    (dict(session_pin_ttl=-1.0), "session_pin_ttl must be >= 0.0 and <= 86400.0"),
    (dict(max_pinned_blocks=-1), "max_pinned_blocks must be >= 0"),
])
def test_validation_names_field_and_range(settings, message):
    with pytest.raises(ValueError, match=message):
        CacheConfig(**settings)


def test_flags_and_yaml(tmp_path):
    (tmp_path / "c.yaml").write_text("session-pin-ttl: 7.5\n")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    engine, _ = build_configs(parser.parse_args(["--config", str(tmp_path / "c.yaml"), "--max-pinned-blocks", "9"]))
    assert (engine.cache.session_pin_ttl, engine.cache.max_pinned_blocks) == (7.5, 9)
