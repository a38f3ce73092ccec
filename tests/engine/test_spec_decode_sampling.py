"""Speculation keeps the sampling distribution (H20 and issue 17): token frequency tables of many samples with
speculation off and on (a benchmark `replay` proposer whose drafts are the greedy continuation half of the
time and a wrong token otherwise, so drafts are often rejected) are the same by a chi-square test; seeded
requests repeat exactly with speculation on."""

from __future__ import annotations

from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from shared_engine import LLM, SamplingParams

PROMPT = "The colour of the sky is"
SAMPLES = 2000
COMMON = {"max_model_len": 128, "max_num_seqs": 128, "kv_cache_memory": 64 * 2**20}
REPLAY = {"method": "replay", "num_speculative_tokens": 2, "policy": "always", "acceptance_rate": 0.5}


@pytest.fixture(scope="module")
def engines():
    off, on = LLM(**COMMON), LLM(**COMMON, speculative_config=REPLAY)
    ids = off.get_tokenizer()(PROMPT)["input_ids"]
    greedy = off.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0.0, max_tokens=4),
                          use_tqdm=False)[0].outputs[0].token_ids
    on.engine.spec.proposer.record(ids, greedy)
    return off, on, ids


def _tables(llm: LLM, ids: list[int], params: SamplingParams) -> list[Counter]:
    outs = llm.generate([{"prompt_token_ids": ids}] * SAMPLES, params, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outs]
    return [Counter(t[j] for t in tokens if len(t) > j) for j in range(params.max_tokens)]


def _same_distribution(a: Counter, b: Counter) -> float:
    """p-value of a chi-square test of homogeneity; tokens seen < 10 times in both runs are pooled."""
    common = [t for t in set(a) | set(b) if a[t] + b[t] >= 10]
    rows = [[a[t] for t in common], [b[t] for t in common]]
    rest = [sum(a.values()) - sum(rows[0]), sum(b.values()) - sum(rows[1])]
    if max(rest) > 0:
        rows[0].append(rest[0])
        rows[1].append(rest[1])
    return chi2_contingency(rows).pvalue


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_p=0.9, max_tokens=2, seed=None),  # H20
    SamplingParams(temperature=0.8, top_k=20, max_tokens=3),
], ids=["H20_t0.7_top_p0.9", "t0.8_top_k20"])
def test_token_frequencies_match_speculation_off(engines, params):
    off, on, ids = engines
    spec = on.engine.stats.spec
    before = (spec.num_draft_tokens_total, spec.num_accepted_tokens_total)
    tables_off, tables_on = _tables(off, ids, params), _tables(on, ids, params)
    drafted = spec.num_draft_tokens_total - before[0]
    accepted = spec.num_accepted_tokens_total - before[1]
    assert drafted >= SAMPLES and 0.1 * drafted < accepted < 0.9 * drafted  # drafts often disagree
    for position, (a, b) in enumerate(zip(tables_off, tables_on)):
        assert _same_distribution(a, b) > 0.01, (position, a.most_common(8), b.most_common(8))


def test_seeded_requests_repeat_with_speculation(engines):
    _, on, ids = engines
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=3) for s in range(6)]
    first = [o.outputs[0].token_ids for o in on.generate([{"prompt_token_ids": ids}] * 6, params, use_tqdm=False)]
    again = [o.outputs[0].token_ids for o in on.generate([{"prompt_token_ids": ids}] * 6, params, use_tqdm=False)]
    assert first == again and len({tuple(t) for t in first}) > 1
