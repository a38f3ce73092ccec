"""Sampled drafts of the `draft_model` method (spec_decode/draft_sampling.py): at temperature > 0 the draft
draws each token from its own distribution q and the rejection sampler gets q, so the output follows the
target's distribution exactly. A tiny 2-layer Llama with peaked random weights as the target and its first
layer as the draft (which disagrees often); 2,000 samples of the first three tokens with
speculation on against 2,000 from the plain sampler (speculation off), chi-square per position, p > 0.01.

Treating a drawn draft as one-hot would be exact as well (it accepts with p(d) and draws the rest from p
without d), only less often: with q passed in, acceptance is 0.2-0.8 here; with q withheld it measured 0.08
(the rate bound fails). What the chi-square catches is a q that is not the draft's: drafts drawn from q^2 but
verified against q gave p = 4e-4 (top-p) and 4e-8 (top-k) at position 1 when tried."""

from __future__ import annotations

from collections import Counter

import pytest

from shared_engine import LLM, SamplingParams
from tests.engine.spec_cases import write_tiny_llama

PROMPT = [5, 17, 33, 8]
SAMPLES = 2000


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from shared_engine.model_loader.layer_subset import write_layer_subset

    target = tmp_path_factory.mktemp("tiny-target")
    write_tiny_llama(target, weak_second_layer=0.1)  # its first layer alone: near the target, not equal
    draft = write_layer_subset(target, tmp_path_factory.mktemp("tiny-draft") / "draft", 1)
    # block_size 1: the samples share the prompt from the prefix cache
    return LLM(str(target), max_model_len=64, max_num_seqs=256, block_size=1, kv_cache_memory=32 * 2**20,
               speculative_config={"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2,
                                   "policy": "always"})


def _samples(llm: LLM, params: SamplingParams) -> list[tuple[int, ...]]:
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * SAMPLES, params, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids) for o in outs]


def _p_value(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square p-value over the tokens seen; tokens seen fewer than 10 times in all are pooled."""
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    tokens = sorted(set(ca) | set(cb))
    big = [t for t in tokens if ca[t] + cb[t] >= 10]
    rows = [[ca[t] for t in big], [cb[t] for t in big]]
    small = [t for t in tokens if t not in big]
    if small:
        rows[0].append(sum(ca[t] for t in small))
        rows[1].append(sum(cb[t] for t in small))
    return chi2_contingency(rows)[1]


@pytest.mark.parametrize("params", [{"top_p": 0.9}, {"top_k": 20}], ids=["t0.8_top_p0.9", "t0.8_top_k20"])
def test_sampled_drafts_keep_the_target_distribution(engine, params):
    sampling = SamplingParams(temperature=0.8, max_tokens=3, ignore_eos=True, **params)
    e = engine.engine
    spec, draft = e.spec, e.runner.draft_runner
    e.spec, e.runner.draft_runner = None, None
    off = _samples(engine, sampling)
    e.spec, e.runner.draft_runner = spec, draft
    drafted, accepted, sampled = (e.stats.spec.num_draft_tokens_total, e.stats.spec.num_accepted_tokens_total,
                                  draft.num_sampled_drafts)
    on = _samples(engine, sampling)
    assert draft.num_sampled_drafts - sampled > SAMPLES  # drafts drawn from q, not the argmax
    rate = (e.stats.spec.num_accepted_tokens_total - accepted) / (e.stats.spec.num_draft_tokens_total - drafted)
    assert 0.2 < rate < 0.8, rate  # a draft that often disagrees: accepts and residual draws both matter
    for position in range(3):
        p = _p_value([s[position] for s in on], [s[position] for s in off])
        assert p > 0.01, (position, p)


def test_seeded_sampled_drafts_repeat(engine):
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=6, ignore_eos=True, seed=s) for s in range(8)]
    first = engine.generate([{"prompt_token_ids": PROMPT}] * 8, params, use_tqdm=False)
    again = engine.generate([{"prompt_token_ids": PROMPT}] * 8, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]
    assert len({tuple(o.outputs[0].token_ids) for o in first}) > 1  # the seeds differ, so do the samples
