"""Speculation keeps the sampling distribution (H20 and issue 17). 2,000 samples of the first two tokens with
speculation on, drawn through the rejection sampler (a benchmark `replay` proposer whose draft is the greedy
token half of the time and a wrong token otherwise, so drafts are often rejected and the residual is drawn),
follow the exact distribution computed from transformers' logits with a plain reference of temperature,
top-p and top-k (chi-square goodness of fit, p > 0.01, first token and second token). The model is a tiny
2-layer Llama with peaked random weights (`spec_cases.write_tiny_llama`: the default model made each case take
2-3 minutes on a loaded 2-core machine, for the same property of the sampler). Seeded requests repeat
exactly with speculation on, given the same drafts (which tokens a step emits depends on its drafts, so a
proposer whose drafts depend on other requests, as the suffix tree's do, makes a seeded output depend on them)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from shared_engine import LLM, SamplingParams
from tests.engine.spec_cases import write_tiny_llama

PROMPT = [5, 17, 33, 8, 61, 40]  # token ids of the tiny model
SAMPLES = int(__import__("os").environ.get("SPEC_SAMPLES", 2000))
# block_size 1: the samples share all but the prompt's last token from the prefix cache (1 of 6 tokens computed
# per sample, then 2 in its speculative step), a quarter fewer token forwards than 4 (2 of 6 computed)
COMMON = {"max_model_len": 128, "max_num_seqs": 128, "kv_cache_memory": 64 * 2**20, "block_size": 1}
REPLAY = {"method": "replay", "num_speculative_tokens": 2, "policy": "always", "acceptance_rate": 0.5}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, write_tiny_llama(path)


@pytest.fixture(scope="module")
def hf_model(tiny):
    return tiny[1]


@pytest.fixture(scope="module")
def engine(tiny):
    on = LLM(str(tiny[0]), **COMMON, speculative_config=REPLAY)
    ids = PROMPT
    spec, on.engine.spec = on.engine.spec, None  # the greedy continuation, speculation off, for the replay
    greedy = on.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0.0, max_tokens=4),
                         use_tqdm=False)[0].outputs[0].token_ids
    return on, ids, greedy, spec


def _reference(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """[vocab] float64 probabilities: softmax(logits / T) cut to the top k, then to the smallest set of
    top tokens whose mass reaches top_p, renormalised (vLLM's order)."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    kept = order[:top_k] if top_k > 0 else order
    mass = probs[kept].cumsum(0) / probs[kept].sum()
    keep[kept[: int((mass < top_p).sum()) + 1]] = True
    cut = torch.where(keep, probs, torch.zeros_like(probs))
    return cut / cut.sum()


def _gof(counts: Counter, probs: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value; tokens expected < 5 times are pooled into one cell."""
    from scipy.stats import chisquare

    n = sum(counts.values())
    expected = probs * n
    big = [int(t) for t in torch.nonzero(expected >= 5).flatten()]
    observed = [counts.get(t, 0) for t in big]
    exp = [float(expected[t]) for t in big]
    rest_obs, rest_exp = n - sum(observed), n - sum(exp)
    if rest_exp > 1e-9:
        observed.append(rest_obs)
        exp.append(rest_exp)
    else:
        assert rest_obs == 0, "samples outside the distribution's support"
    return chisquare(observed, exp, sum_check=False).pvalue


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.7, 0.9, 0), (0.8, 1.0, 20)],
                         ids=["H20_t0.7_top_p0.9", "t0.8_top_k20"])
def test_first_two_tokens_follow_the_target(engine, hf_model, temperature, top_p, top_k):
    llm, ids, greedy, spec = engine
    llm.engine.spec = spec
    spec.proposer.record(ids, greedy)
    stats = llm.engine.stats.spec
    before = (stats.num_draft_tokens_total, stats.num_accepted_tokens_total)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=2)
    outs = llm.generate([{"prompt_token_ids": ids}] * SAMPLES, params, use_tqdm=False)
    drafted = stats.num_draft_tokens_total - before[0]
    accepted = stats.num_accepted_tokens_total - before[1]
    assert drafted >= SAMPLES and 0.02 * drafted < accepted < 0.9 * drafted  # drafts often rejected
    tokens = [o.outputs[0].token_ids for o in outs]
    assert all(len(t) == 2 for t in tokens)
    with torch.no_grad():
        first_logits = hf_model(torch.tensor([ids])).logits[0, -1]
        p1 = _reference(first_logits, temperature, top_p, top_k)
        support = [int(t) for t in torch.nonzero(p1).flatten()]
        nxt = hf_model(torch.tensor([ids + [t] for t in support])).logits[:, -1]
        p2 = sum(p1[t] * _reference(nxt[i], temperature, top_p, top_k) for i, t in enumerate(support))
    assert _gof(Counter(t[0] for t in tokens), p1) > 0.01
    assert _gof(Counter(t[1] for t in tokens), p2) > 0.01


def test_seeded_requests_repeat_with_speculation(engine):
    llm, ids, greedy, spec = engine
    llm.engine.spec = spec
    spec.proposer.record(ids, greedy)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=3) for s in range(6)]
    # the same drafts each time (the replay's right-or-wrong stream restarted): a seeded request then repeats
    spec.proposer.reseed(0)
    first = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": ids}] * 6, params, use_tqdm=False)]
    spec.proposer.reseed(0)
    again = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": ids}] * 6, params, use_tqdm=False)]
    assert first == again and len({tuple(t) for t in first}) > 1
