"""The capacity model's speculative step: acceptance rate as a workload parameter; the predicted batch-1
speed-up follows E(k) = (1 - a^(k+1)) / (1 - a) tokens per step at the roofline's price of a k + 1-token step."""

from __future__ import annotations

import pytest

from shared_engine.config import EngineConfig
from shared_engine.sim import Simulator, WorkloadSpec, load_hardware
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.spec_decode.auto_policy import expected_tokens

ONE = {"name": "one", "seed": 1, "num_requests": 1, "arrival": {"process": "poisson", "rate": 1},
       "prompt_len": {"dist": "fixed", "value": 256}, "output_len": {"dist": "fixed", "value": 400}}


def _tpot(acceptance: float | None, k: int = 5) -> float:
    _, arch = resolve_arch("llama-3.1-8b")
    extra = {} if acceptance is None else {"speculative_config": {
        "method": "ngram", "num_speculative_tokens": k, "policy": "always", "acceptance_rate": acceptance}}
    sim = Simulator(EngineConfig.from_flat(max_model_len=2048, max_num_seqs=8, **extra), arch, load_hardware("H200"))
    return sim.run_replicas(WorkloadSpec.from_dict(ONE), 1).summary()["mean_tpot_ms"]


@pytest.mark.parametrize("acceptance", [0.6, 0.8])
def test_batch1_speedup_follows_expected_tokens(acceptance):
    off, on = _tpot(None), _tpot(acceptance)
    speedup = off / on
    # a memory-bound 8B decode: a 6-token step costs about as much as a 1-token step
    assert speedup == pytest.approx(expected_tokens(acceptance, 5), rel=0.15)
    assert speedup > 1.5


def test_zero_acceptance_only_costs():
    assert _tpot(0.0) >= _tpot(None)
