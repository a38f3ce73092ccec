"""The trace in the simulator: sessions are closed loops (turn k+1 the trace's gap after turn k finished),
the routers split as described, and on the engine's own scheduler a session hash keeps a session's prefix
hits that round-robin loses."""

from __future__ import annotations

import pytest

from case_coding_agent.loadtest.trace import TraceRecord
from case_coding_agent.sim_case import simulate
from case_coding_agent.sim_trace import SessionTraceWorkload, route
from shared_engine.config import EngineConfig
from shared_engine.sim.hardware import load_hardware
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.simulator import Simulator


def session(name, start_ms, turns, block=16, first=64, growth=32, gap_ms=1000):
    out, ids = [], []
    for k in range(turns):
        n = first + k * growth
        hashes = [hash((name, i)) % 10**6 for i in range(-(-n // block))]  # a turn extends the previous one
        hashes = hashes[:-1] + [hash((name, "last", k)) % 10**6] if n % block else hashes
        out.append(TraceRecord(start_ms + k * gap_ms, n, 4, hashes, name, k + 1, f"{name}-{k + 1}"))
        ids.append(hashes)
    return out


def test_a_turn_is_due_its_gap_after_the_previous_one_finished():
    records = session("a", 500, 3)
    w = SessionTraceWorkload(records, 16, 1000, 4096)
    assert w.peek_time() == 0.5
    (first,) = w.pop_due(0.5)
    assert first.session_id == "a" and len(first.prompt_token_ids) == 64 and w.peek_time() == float("inf")
    w.on_finish(first, [0] * 4, now=7.0)  # finished at 7 s: the next turn at 7 + 1 s
    assert w.peek_time() == 8.0 and w.pop_due(7.9) == []
    (second,) = w.pop_due(8.0)
    assert second.prompt_token_ids[:48] == first.prompt_token_ids[:48]  # the shared whole blocks


def test_routes():
    records = [r for name in "abcdefgh" for r in session(name, 0, 6)]
    hashed = route(records, "session_hash", 2)
    homes = {r.session_id: [i for i, part in enumerate(hashed) if r in part] for r in records}
    assert all(len(h) == 1 for h in homes.values()) and sum(map(len, hashed)) == 48
    dealt = route(records, "round_robin", 2)
    split = [{i for i, part in enumerate(dealt) if r in part} for r in records]
    assert sum(map(len, dealt)) == 48 and all(len(s) == 1 for s in split)
    seen = {name: {i for i, part in enumerate(dealt) for r in part if r.session_id == name} for name in "abcdefgh"}
    moved = sum(len(replicas) == 2 for replicas in seen.values())
    assert moved >= 6  # most sessions see both replicas
    with pytest.raises(ValueError, match="round_robin"):
        route(records, "random", 2)


def test_session_hash_keeps_the_prefix_hits_round_robin_loses():
    _, arch = resolve_arch("smollm2-135m")
    config = EngineConfig.from_flat(max_model_len=1024, num_gpu_blocks_override=256, session_pin_ttl=5)
    sim = Simulator(config, arch, load_hardware("cpu-2core"))
    records = session("a", 0, 4, growth=48) + session("b", 300, 4, growth=48)
    hashed = simulate(sim, records, 16, "session_hash", 2)["summary"]
    dealt = simulate(sim, records, 16, "round_robin", 2)["summary"]
    assert hashed["sessions_on_one_replica"] == 2 and dealt["sessions_on_one_replica"] == 0
    assert hashed["turns2plus_hit_rate"] > 0.6 > dealt["turns2plus_hit_rate"], (hashed, dealt)
