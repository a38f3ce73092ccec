"""case_multilora/loadtest/sim_isolation.py: in the capacity model (the engine's scheduler, recorded step profiles)
on the CPU shape the fix's long-prefill yield lowers the well-behaved p99 TTFT under the whales' bursts against
the fix without it, leaves the isolated run alone (no long prompts there), and the first attempt is far worse;
on the H200 shape (h200_quick.py's load) the over-share prefill cap (core/share_cap.py) brings the tail under
the whales back to the isolated one, where the fix at aab412d (no cap) was 1.3-1.7x, and the CPU cap lowers it too
without touching the isolated run."""

from __future__ import annotations

from case_multilora.loadtest import sim_isolation as si


def test_yield_lowers_the_modelled_tail_under_whales():
    fix, before = si.simulate("cpu", "the_fix", True, 300), si.simulate("cpu", "before_yield", True, 300)
    alone_fix, alone_before = si.simulate("cpu", "the_fix", False, 300), si.simulate("cpu", "before_yield", False, 300)
    assert alone_fix["well_behaved_p99_ttft_ms"] == alone_before["well_behaved_p99_ttft_ms"]
    assert fix["num_well_behaved"] == before["num_well_behaved"] == alone_fix["num_well_behaved"] > 100
    assert fix["well_behaved_p99_ttft_ms"] < 0.6 * before["well_behaved_p99_ttft_ms"], (fix, before)
    assert fix["whale_median_e2e_ms"] >= before["whale_median_e2e_ms"]  # the whales pay for it
    first = si.simulate("cpu", "first_attempt", True, 300)
    assert first["well_behaved_p99_ttft_ms"] > 10 * fix["well_behaved_p99_ttft_ms"]


def test_cpu_cap_lowers_the_tail_and_leaves_the_isolated_run_alone():
    fix, before = si.simulate("cpu", "the_fix", True, 600), si.simulate("cpu", "before_cap", True, 600)
    alone_fix, alone_before = si.simulate("cpu", "the_fix", False, 600), si.simulate("cpu", "before_cap", False, 600)
    assert alone_fix["well_behaved_p99_ttft_ms"] == alone_before["well_behaved_p99_ttft_ms"]  # questions uncapped
    assert fix["well_behaved_p99_ttft_ms"] < 0.95 * before["well_behaved_p99_ttft_ms"], (fix, before)


def test_h200_cap_keeps_the_tail_within_the_slo():
    alone = si.simulate("h200", "the_fix", False, 300)
    fix, before = si.simulate("h200", "the_fix", True, 300), si.simulate("h200", "before_cap", True, 300)
    alone_before = si.simulate("h200", "before_cap", False, 300)
    assert alone["well_behaved_p99_ttft_ms"] == alone_before["well_behaved_p99_ttft_ms"]
    assert fix["num_well_behaved"] == alone["num_well_behaved"] > 3000 and fix["num_whale"] > 800
    assert fix["well_behaved_p99_ttft_ms"] < 1.1 * alone["well_behaved_p99_ttft_ms"], (fix, alone)
    assert before["well_behaved_p99_ttft_ms"] > 1.25 * alone["well_behaved_p99_ttft_ms"], (before, alone)
    assert fix["whale_median_e2e_ms"] < 1.1 * before["whale_median_e2e_ms"]  # the whales lose little
