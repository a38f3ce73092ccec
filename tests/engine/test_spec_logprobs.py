"""Logprobs under speculation (handed.md K10: "logprobs reading 0.0 or coming from the draft"): every returned
token's logprob, rank and top-2 are the target model's, recomputed independently as prompt logprobs of the prompt
plus the returned tokens with speculation off; for greedy and for seeded sampled requests (temperature 0.8, whose
sampled tokens differ from speculation off's), with k = 5 n-gram drafting on the default model, and with a draft
model that is not the target: a tiny 2-layer Llama (spec_cases.write_tiny_llama, milliseconds a forward on the
CPU) drafted for by its first layer, k = 3 (the draft's logprobs differ from the target's, so one read from the
draft shows).
Only the tokens after an accepted draft are the ones at risk, so the test also checks that many were accepted."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams
from shared_engine.model_loader.layer_subset import write_layer_subset
from tests.engine.spec_cases import PROSE, REPETITIVE, write_tiny_llama

COMMON = {"max_model_len": 256, "num_gpu_blocks_override": 96, "max_num_seqs": 32}
PROMPTS = REPETITIVE[:4] + PROSE[:2]
TINY_PROMPTS = [[5, 17, 33, 8], [40, 41, 42, 43, 40, 41], [9] * 6, [70, 3, 70, 3, 70], [11, 60, 22, 91], [30]]
TINY = {"max_model_len": 64, "max_num_seqs": 32, "kv_cache_memory": 32 * 2**20}
TOP = 2


def _spec(method: str, k: int, model=None) -> dict:
    config = {"method": method, "num_speculative_tokens": k, "policy": "always"}
    return config if model is None else {**config, "model": str(model)}


def _params(kind: str) -> SamplingParams:
    if kind == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=20, logprobs=TOP, ignore_eos=True)
    return SamplingParams(temperature=0.8, seed=3, max_tokens=20, logprobs=TOP, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(default_model_dir, tmp_path_factory):
    """name -> (the speculative engine, its speculation-off twin, its prompts)."""
    target = tmp_path_factory.mktemp("tiny-target")
    write_tiny_llama(target, weak_second_layer=0.1)  # its first layer alone: near the target, not equal
    draft = write_layer_subset(target, tmp_path_factory.mktemp("tiny-draft") / "draft", 1)
    off = LLM(**COMMON)
    return {"ngram": (LLM(**COMMON, speculative_config=_spec("ngram", 5)), off, PROMPTS),
            "draft": (LLM(str(target), **TINY, speculative_config=_spec("draft_model", 3, draft)),
                      LLM(str(target), **TINY), [{"prompt_token_ids": p} for p in TINY_PROMPTS])}


def _reference(off: LLM, prompt_ids: list[int], output_ids: list[int]) -> list[dict]:
    """The target's logprobs of `output_ids` after `prompt_ids`: prompt logprobs of the whole, speculation off."""
    out = off.generate([{"prompt_token_ids": prompt_ids + output_ids}],
                       SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=TOP), use_tqdm=False)[0]
    return out.prompt_logprobs[len(prompt_ids):]


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
@pytest.mark.parametrize("engine", ["ngram", "draft"])
def test_logprobs_are_the_targets_recomputed(engines, engine, kind):
    llm, off, prompts = engines[engine]
    spec = llm.engine.stats.spec
    accepted_before = spec.num_accepted_tokens_total
    outputs = llm.generate(prompts, _params(kind), use_tqdm=False)
    assert spec.num_accepted_tokens_total - accepted_before >= 10  # tokens that came out of accepted runs
    checked = 0
    for prompt, output in zip(prompts, outputs):
        prompt_ids = output.prompt_token_ids
        completion = output.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids) > 0
        reference = _reference(off, prompt_ids, completion.token_ids)
        for position, (token, got, want) in enumerate(zip(completion.token_ids, completion.logprobs, reference)):
            assert got.keys() == want.keys(), (prompt, position)
            for tid in want:
                assert got[tid].logprob == pytest.approx(want[tid].logprob, abs=2e-3), (prompt, position, tid)
            assert got[token].rank == want[token].rank, (prompt, position)
            checked += 1
    assert checked == sum(len(o.outputs[0].token_ids) for o in outputs)


def test_sampled_tokens_are_not_speculation_offs(engines):
    """The sampled case checks logprobs of tokens that speculation off would not have produced (a different random
    stream), so its reference cannot be the off run's own logprobs."""
    on, off, prompts = engines["ngram"]
    off, on = (llm.generate(prompts, _params("sampled"), use_tqdm=False) for llm in (off, on))
    assert [o.outputs[0].token_ids for o in off] != [o.outputs[0].token_ids for o in on]
