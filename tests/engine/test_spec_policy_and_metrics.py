"""The auto policy (speculate only where expected tokens per second beat plain decoding) and the speculative
decoding metrics (vLLM's names, counted in tokens, per draft position; the model as its own draft accepts
>= 0.9 on random word lists and n-gram strictly less; the 10-second log line's acceptance rate, mean acceptance
length and share of speculative steps over its window)."""

from __future__ import annotations

import logging
import random
import re
import time

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


# ---- acceptance on random word lists: the model as its own draft vs n-gram ----------------------------------
WORDS = ["apple", "river", "stone", "cloud", "music", "green", "table", "horse", "paper", "light", "window",
         "sugar", "bread", "chair", "ocean", "pencil", "garden", "silver", "monkey", "candle", "forest", "rocket",
         "butter", "mirror", "planet", "yellow", "bottle", "basket", "winter", "dragon", "castle", "tiger",
         "violin", "carpet", "lemon", "spider", "tunnel", "velvet", "hammer", "island"]


def random_word_lists(n: int = 6, length: int = 50, seed: int = 17) -> list[str]:
    """Seeded random comma-separated lists of 40 common words: a 50-word list repeats some words (with
    different followers), so n-gram lookup finds matches, but what follows a match is chance."""
    rng = random.Random(seed)
    return [", ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(n)]


def test_self_draft_accepts_random_word_lists_and_ngram_less(default_model_dir):
    """Issue 17's metric: with the model as its own draft, acceptance >= 0.9; n-gram on random word lists
    strictly lower (same k = 4, policy "always", greedy, the same outputs). On the CPU: 72 of 72 drafts
    accepted against n-gram's 48 of 77 (0.62: it drafts from the lists' repeated words, and this small model's
    continuation soon repeats a few words, which it then predicts)."""
    lists = random_word_lists()
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    common = {"max_model_len": 256, "num_gpu_blocks_override": 48, "max_num_seqs": 8}
    rate, outputs = {}, {}
    for method, extra in (("ngram", {}), ("draft_model", {"model": str(default_model_dir)})):
        llm = LLM(**common, speculative_config={"method": method, "num_speculative_tokens": 4, "policy": "always",
                                                **extra})
        outputs[method] = [o.outputs[0].token_ids for o in llm.generate(lists, params, use_tqdm=False)]
        spec = llm.engine.stats.spec
        assert spec.num_draft_tokens_total >= 20, method  # n-gram too drafted: the comparison is not vacuous
        rate[method] = spec.num_accepted_tokens_total / spec.num_draft_tokens_total
    assert outputs["ngram"] == outputs["draft_model"]
    assert rate["draft_model"] >= 0.9, rate
    assert rate["ngram"] < rate["draft_model"], rate


# ---- the 10-second log line ------------------------------------------------------------------------------------
_SPEC_LINE = re.compile(r"SpecDecoding metrics: Draft acceptance rate: (\d+\.\d)%, Mean acceptance length: "
                        r"(\d+\.\d\d), Speculative steps: (\d+\.\d)%")


def _window_counters(engine, spec_steps: list[bool]) -> tuple[int, int, int, int, int]:
    """(drafts, draft tokens, accepted, steps that speculated, steps) so far, the steps from the scheduler's
    outputs rather than from the speculative counters."""
    spec = engine.stats.spec
    return (spec.num_drafts_total, spec.num_draft_tokens_total, spec.num_accepted_tokens_total, sum(spec_steps),
            len(spec_steps))


def _expected_line(before, after) -> tuple[float, float, float]:
    drafts, tokens, accepted, spec_steps, steps = (b - a for a, b in zip(before, after))
    return 100.0 * accepted / tokens, 1.0 + accepted / drafts, 100.0 * spec_steps / steps


def test_stats_log_line_reports_the_window_acceptance(caplog):
    """The periodic stats line's "SpecDecoding metrics" give the acceptance rate, mean acceptance length and
    share of speculative steps over the steps since the previous line: here a line at step 3 (its 10 seconds
    elapsed then: the prefill step and two speculative decodes) and one at the end (the method called
    directly) agree with the counters' deltas over those steps; with speculation off no such line."""
    llm = LLM(max_model_len=256, kv_cache_memory=64 * 2**20, async_scheduling=False,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4, "policy": "always"})
    engine, stats = llm.engine, llm.engine.stats
    spec_steps: list[bool] = []
    schedule = engine.scheduler.schedule

    def recording_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        if not out.is_empty:
            spec_steps.append(out.has_drafts)
        return out

    engine.scheduler.schedule = recording_schedule
    tokenizer = llm.get_tokenizer()
    for i, prompt in enumerate(REPETITIVE[:3]):
        engine.add_request(f"r{i}", tokenizer(prompt)["input_ids"], SamplingParams(temperature=0.0, max_tokens=24))
    start = _window_counters(engine, spec_steps)
    assert start == (0, 0, 0, 0, 0)
    marks = [start]
    with caplog.at_level(logging.INFO, logger="shared_engine"):
        while engine.has_unfinished_requests():
            # the 10 seconds have passed before the third step only (never by the clock: speed does not matter)
            third = len(spec_steps) == 2
            stats._last_log = time.monotonic() + (-60.0 if third else 1e6)
            engine.step()
            if third:
                assert len(spec_steps) == 3
                marks.append(_window_counters(engine, spec_steps))
        assert len(marks) == 2 and len(spec_steps) > 3
        now = time.monotonic()
        stats._last_log = now - 10.0
        stats._log(now, engine.scheduler, engine.block_manager)  # the rest of the run: the next line's window
        marks.append(_window_counters(engine, spec_steps))
    lines = [r.getMessage() for r in caplog.records if "SpecDecoding" in r.getMessage()]
    assert len(lines) == 2, lines
    for line, before, after in zip(lines, marks, marks[1:]):
        match = _SPEC_LINE.fullmatch(line)
        assert match, line
        logged = tuple(float(g) for g in match.groups())
        expected = _expected_line(before, after)
        assert logged == pytest.approx(expected, abs=0.051), (line, expected)
    first = _expected_line(marks[0], marks[1])
    assert first[2] == pytest.approx(200.0 / 3)  # the prefill step did not speculate, the two decodes did
    assert first[1] > 1.0  # and drafts were accepted

    off = LLM(max_model_len=256, kv_cache_memory=64 * 2**20, async_scheduling=False)
    caplog.clear()
    off.engine.stats._last_log -= 60.0
    with caplog.at_level(logging.INFO, logger="shared_engine"):
        off.generate(REPETITIVE[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Avg prompt throughput") for m in messages)  # the line was logged ...
    assert not any("SpecDecoding" in m for m in messages)  # ... without speculative metrics
