"""Sampling semantics on the default model: seeds, n, top-k sentinels, and penalties against a reference."""

from __future__ import annotations

import math

import pytest
import torch

from shared_engine import LLM, SamplingParams

PROMPT = "Write a sentence about a cat who likes to"


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=512, kv_cache_memory=128 * 2**20)


def texts(llm, params, prompt=PROMPT):
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    return [c.token_ids for c in out.outputs]


def test_seeded_runs_repeat(llm):
    p = SamplingParams(temperature=1.0, seed=7, max_tokens=20)
    assert texts(llm, p) == texts(llm, p)


def test_seeded_run_is_independent_of_batch_neighbours(llm):
    p = SamplingParams(temperature=1.0, seed=11, max_tokens=16)
    alone = texts(llm, p)
    batch = llm.generate([PROMPT, "Another prompt entirely", PROMPT], [p, SamplingParams(temperature=1.0), p],
                         use_tqdm=False)
    assert [c.token_ids for c in batch[0].outputs] == alone == [c.token_ids for c in batch[2].outputs]


def test_different_seeds_differ(llm):
    runs = [texts(llm, SamplingParams(temperature=1.0, seed=s, max_tokens=30))[0] for s in (1, 2, 3)]
    assert len({tuple(r) for r in runs}) > 1


def test_n4_choices_differ_and_repeat(llm):
    p = SamplingParams(n=4, temperature=1.0, seed=42, max_tokens=16)
    first, second = texts(llm, p), texts(llm, p)
    assert len(first) == 4
    assert len({tuple(c) for c in first}) > 1
    assert first == second


def test_top_k_one_equals_greedy(llm):
    greedy = texts(llm, SamplingParams(temperature=0.0, max_tokens=20))
    assert texts(llm, SamplingParams(temperature=1.0, top_k=1, seed=3, max_tokens=20)) == greedy


def test_top_k_sentinels_agree(llm):
    results = [texts(llm, SamplingParams(temperature=1.0, seed=7, max_tokens=20, **kw))
               for kw in ({"top_k": 0}, {"top_k": -1}, {}, {"top_k": 100000})]
    assert all(r == results[0] for r in results)


def test_only_temperature_zero_is_greedy(llm):
    greedy = texts(llm, SamplingParams(temperature=0.0, max_tokens=30))
    sampled = {tuple(texts(llm, SamplingParams(temperature=1.0, seed=s, max_tokens=30))[0]) for s in range(4)}
    assert sampled != {tuple(greedy[0])}


# ---- penalties against a small reference sampler ---------------------------------------------------------
def reference_penalised(logits: torch.Tensor, prompt: list[int], output: list[int], presence: float,
                        frequency: float, repetition: float) -> torch.Tensor:
    """Textbook definitions, one token at a time (no vectorisation)."""
    logits = logits.clone()
    for token in set(prompt) | set(output):
        if repetition != 1.0:
            value = logits[token].item()
            logits[token] = value / repetition if value > 0 else value * repetition
    for token in set(output):
        count = output.count(token)
        logits[token] -= frequency * count + presence
    return logits


@pytest.mark.parametrize("penalty", [
    {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 1.3},
    {"presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 0.8},
])
def test_penalties_match_reference(llm, default_model_dir, penalty):
    """Greedy decoding with penalties: recompute each step's logits with transformers, apply the reference
    penalties, and check every chosen token is the reference argmax."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    tok = llm.get_tokenizer()
    prompt = tok.encode("Paris Paris Paris Paris")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, **penalty), use_tqdm=False)[0]
    generated = out.outputs[0].token_ids
    for step in range(len(generated)):
        ids = prompt + generated[:step]
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
        ref = reference_penalised(logits, prompt, generated[:step], penalty.get("presence_penalty", 0.0),
                                  penalty.get("frequency_penalty", 0.0), penalty.get("repetition_penalty", 1.0))
        top2 = ref.topk(2).values
        if top2[0] - top2[1] > 1e-4:  # skip exact near-ties, where fp32 rounding may pick either
            assert generated[step] == int(ref.argmax()), f"step {step}"


def test_presence_penalty_leaves_first_token_alone(llm):
    """Presence/frequency count generated tokens only: the first token equals the unpenalised greedy one."""
    tok = llm.get_tokenizer()
    prompt = tok.encode("Paris Paris Paris Paris")
    plain = texts(llm, SamplingParams(temperature=0.0, max_tokens=5), prompt)[0]
    for kw in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        assert texts(llm, SamplingParams(temperature=0.0, max_tokens=5, **kw), prompt)[0][0] == plain[0]


def test_logprobs_are_log_softmax_of_model(llm, default_model_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    tok = llm.get_tokenizer()
    prompt = tok.encode("The sky is")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=3, logprobs=5), use_tqdm=False)[0]
    choice = out.outputs[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt + choice.token_ids])).logits[0].float(), -1)
    total = 0.0
    for step, (token, entry) in enumerate(zip(choice.token_ids, choice.logprobs)):
        row = ref[len(prompt) - 1 + step]
        assert math.isclose(entry[token].logprob, row[token].item(), abs_tol=1e-3)
        assert entry[token].rank == 1
        assert set(entry) == set(row.topk(5).indices.tolist()) | {token}
        total += entry[token].logprob
    assert math.isclose(choice.cumulative_logprob, total, abs_tol=1e-4)


def test_top_k_top_p_min_p_filters_per_row():
    """The filters with different settings per row in one batch (device tensors built from the rows' values):
    each row keeps exactly the tokens its own reference filter keeps."""
    from shared_engine.sampling.sampler import _min_p, _top_k, _top_p

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=gen)
    ks = [50, 3, 1, 10]  # 50 = vocab: that row keeps everything
    kept = _top_k(logits, ks) > -float("inf")
    for row, k in enumerate(ks):
        want = torch.zeros(50, dtype=torch.bool)
        want[logits[row].topk(k).indices] = True
        assert torch.equal(kept[row], want)
    ps = [1.0, 0.5, 0.9, 0.2]
    kept = _top_p(logits, ps) > -float("inf")
    for row, p in enumerate(ps):
        order = logits[row].argsort(descending=True)
        mass = logits[row].softmax(-1)[order]
        n = int((mass.cumsum(0) - mass < p).sum())  # smallest prefix whose mass reaches p
        assert sorted(kept[row].nonzero().flatten().tolist()) == sorted(order[:n].tolist())
    probs = logits.softmax(-1)
    mins = [0.0, 0.3, 0.05, 1.0]
    filtered = _min_p(probs, mins)
    for row, m in enumerate(mins):
        assert torch.equal(filtered[row] > 0, probs[row] >= m * probs[row].max())
