"""case_multilora/loadtest/sim_isolation.py: in the capacity model (the engine's scheduler, CPU step profile)
the fix's long-prefill yield lowers the well-behaved p99 TTFT under the whales' bursts against the fix
without it, leaves the isolated run alone (no long prompts there), and the first attempt is far worse."""

from __future__ import annotations

from case_multilora.loadtest import sim_isolation as si


def test_yield_lowers_the_modelled_tail_under_whales():
    fix, before = si.simulate("the_fix", True, 300), si.simulate("before_yield", True, 300)
    alone_fix, alone_before = si.simulate("the_fix", False, 300), si.simulate("before_yield", False, 300)
    assert alone_fix["well_behaved_p99_ttft_ms"] == alone_before["well_behaved_p99_ttft_ms"]
    assert fix["num_well_behaved"] == before["num_well_behaved"] == alone_fix["num_well_behaved"] > 100
    assert fix["well_behaved_p99_ttft_ms"] < 0.6 * before["well_behaved_p99_ttft_ms"], (fix, before)
    assert fix["whale_median_e2e_ms"] >= before["whale_median_e2e_ms"]  # the whales pay for it
    first = si.simulate("first_attempt", True, 300)
    assert first["well_behaved_p99_ttft_ms"] > 10 * fix["well_behaved_p99_ttft_ms"]
