"""Greedy token ids of our engine equal transformers' own `generate` on the default model in fp32."""

from __future__ import annotations

import pytest
import torch

from shared_engine import LLM, SamplingParams

PROMPTS = [
    "Hi",
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku.",
    "List three prime numbers and explain, step by step and in plain words, why each one is prime.",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who",
    "Translate to French: The weather is lovely today and I would like to go for a walk in the park.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The history of the printing press begins with the invention of movable type. Explain in detail how "
    "Gutenberg's press changed the spread of knowledge across Europe, touching on literacy, religion, science "
    "and politics, and why historians still debate its importance today.",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def hf_model(default_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def hf_greedy(hf_model, ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(ids):].tolist()


def chat_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def references(hf_model, tokenizer):
    prompts = [chat_ids(tokenizer, p) for p in PROMPTS]
    return prompts, [hf_greedy(hf_model, ids, MAX_TOKENS) for ids in prompts]


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


def test_prompts_have_different_lengths(references):
    prompts, _ = references
    assert len({len(p) for p in prompts}) == len(prompts) >= 8


def test_one_at_a_time_matches_transformers(references):
    prompts, expected = references
    llm = LLM(kv_cache_memory=256 * 2**20, max_model_len=1024)
    for ids, ref in zip(prompts, expected):
        out = llm.generate([ids], GREEDY, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == ref


def test_batched_matches_transformers(references):
    prompts, expected = references
    llm = LLM(kv_cache_memory=256 * 2**20, max_model_len=1024)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    llm.engine.block_manager.check_integrity()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize("length", [31, 32, 33, 48, 64])
def test_chunked_prefill_on_and_off_block_boundaries(hf_model, tokenizer, length):
    """Budget 32 with block size 16 splits prompts of these lengths on and off block boundaries."""
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 20)
    ids = tokenizer.encode(text)[:length]
    ref = hf_greedy(hf_model, ids, 12)
    llm = LLM(block_size=16, max_num_batched_tokens=32, max_model_len=256)
    # a second prompt in the same steps forces mixed decode + prefill-chunk batches
    other = tokenizer.encode("Tell me a story about a dragon.")
    outs = llm.generate([other, ids], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    assert outs[1].outputs[0].token_ids == ref
    assert outs[0].outputs[0].token_ids == hf_greedy(hf_model, other, 12)


def test_preemption_keeps_outputs(references):
    prompts, expected = references
    # 24 blocks of 16 = 384 tokens: far less than 8 concurrent requests need, so the scheduler preempts
    llm = LLM(num_gpu_blocks_override=24, block_size=16, max_model_len=256)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert [o.outputs[0].token_ids for o in outs] == expected
