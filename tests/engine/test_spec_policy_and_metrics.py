"""The auto policy (speculate only where expected tokens per second beat plain decoding) and the speculative
decoding metrics (vLLM's names, counted in tokens, per draft position)."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams
from shared_engine.config.speculative_config import SpeculativeConfig
from shared_engine.core.request import Request
from shared_engine.engine.engine_snapshot import EngineSnapshot
from shared_engine.spec_decode.auto_policy import AutoPolicy, expected_tokens
from tests.engine.spec_cases import REPETITIVE


def _requests(n: int, drafted: int, accepted: int) -> list[Request]:
    reqs = [Request(f"r{i}", [1], SamplingParams(max_tokens=8), max_tokens=8) for i in range(n)]
    for r in reqs:
        r.num_draft_tokens_total, r.num_accepted_tokens_total = drafted, accepted
    return reqs


def _policy(c0: float, c1: float, c2: float = 0.0) -> AutoPolicy:
    policy = AutoPolicy(SpeculativeConfig(num_speculative_tokens=5))
    for tokens, drafts in ((1, 0), (6, 5), (64, 0), (384, 320), (448, 0), (2688, 2240)) * 4:
        # steps of several shapes; a draft token costs what any token does (c3 = c1), a speculative step c2 more
        policy.observe_step(tokens, drafts > 0, c0 + c1 * tokens + c2 * (drafts > 0), drafts)
    return policy


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.8, 5) == pytest.approx(sum(0.8 ** i for i in range(6)))


def test_policy_speculates_before_it_has_measured_steps():
    policy = AutoPolicy(SpeculativeConfig(num_speculative_tokens=4))
    assert policy.num_drafts(_requests(3, 0, 0), 3) == [4, 4, 4]


@pytest.mark.parametrize("c0,c1,c2", [(0.004, 2e-5, 1e-3), (0.005, 2e-3, 5e-4)], ids=["gpu_like", "cpu_like"])
def test_policy_by_batch_and_acceptance(c0, c1, c2):
    policy = _policy(c0, c1, c2)
    assert policy.step_time() == pytest.approx((c0, c1, c2, c1), rel=1e-6)
    assert policy.num_drafts(_requests(1, 100, 85), 1)[0] >= 4  # a lone request that accepts: (nearly) full k
    assert policy.num_drafts(_requests(1, 100, 2), 1) == [0]  # one that never accepts: off
    many = policy.num_drafts(_requests(448, 100, 30), 448)  # a full batch at low acceptance: off
    assert many == [0] * 448
    mixed = policy.num_drafts(_requests(2, 100, 90) + _requests(2, 100, 3), 4)
    assert mixed[0] == mixed[1] > mixed[2] == mixed[3]  # per request: the accepting ones draft further


def test_policy_is_off_where_it_cannot_pay():
    policy = _policy(0.005, 2e-3)  # CPU-like: each token in a step costs 40% of a one-token step
    assert not any(policy.num_drafts(_requests(64, 100, 70), 64))
    assert policy.max_drafts(64) == 0  # so async scheduling keeps overlapping steps ...
    assert policy.max_drafts(8) == 0  # a shrinking batch resolves early only where drafting can pay:
    assert not any(policy.num_drafts(_requests(8, 100, 70), 8))
    policy.num_drafts(_requests(64, 100, 70), 64)
    assert policy.max_drafts(4) == 5 and any(policy.num_drafts(_requests(4, 100, 70), 4))
    policy.num_drafts(_requests(64, 100, 70), 64)
    assert sum(policy.max_drafts(64) for _ in range(64)) == 0  # no periodic re-check where nothing changed


def test_metric_names_and_per_position_labels():
    pytest.importorskip("prometheus_client")
    from shared_engine.entrypoints.openai.metrics import ServerMetrics

    snap = EngineSnapshot(spec_decode_num_drafts_total=4, spec_decode_num_draft_tokens_total=12,
                          spec_decode_num_accepted_tokens_total=7,
                          spec_decode_num_accepted_tokens_per_pos_total=(4, 2, 1))

    class _Engine:
        num_waiting = 0

        def snapshot(self):
            return snap

    text = ServerMetrics(_Engine(), "m").render().decode()
    for line in ('vllm:spec_decode_num_drafts_total{model_name="m"} 4.0',
                 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 12.0',
                 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 7.0',
                 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 2.0'):
        assert line in text


def test_counters_are_tokens_and_positions_nest():
    llm = LLM(max_model_len=256, kv_cache_memory=64 * 2**20,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4, "policy": "always"})
    stats = llm.engine.stats
    outs = llm.generate(REPETITIVE[:3], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    spec = stats.spec
    assert stats.num_generation_tokens_total == sum(len(o.outputs[0].token_ids) for o in outs)  # not steps
    assert spec.num_drafts_total <= stats.num_steps * 3
    assert spec.num_accepted_tokens_total > 0.5 * spec.num_draft_tokens_total  # repetitive text accepts
    per_pos = spec.accepted_per_pos_total
    assert sum(per_pos) == spec.num_accepted_tokens_total
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # position j+1 is accepted only after j
    snap = EngineSnapshot.of(llm.engine)
    assert snap.spec_decode_num_accepted_tokens_per_pos_total == tuple(per_pos)
    assert snap.spec_decode_num_draft_tokens_total == spec.num_draft_tokens_total
