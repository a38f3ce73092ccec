"""Shared by the tensor-parallel tests (offline and server): the prompts, the engine settings, and the
single-process (TP=1) greedy reference, computed once per test process."""

from __future__ import annotations

import functools
import gc

# A 32-token step budget: the longer prompts are prefilled in chunks. 16-token blocks: the shared prefix
# (3+ full blocks) is reused from the prefix cache by the second request that carries it.
SETTINGS = {"max_model_len": 256, "max_num_batched_tokens": 32, "block_size": 16, "kv_cache_memory": 64 << 20,
            "dtype": "float32", "device": "cpu"}
PREFIX = ("You are a helpful assistant. Answer every question in one short sentence, and never "
          "use more words than the question needs; if you do not know the answer, say so plainly and "
          "do not guess. Question: ")
PROMPTS = ["The capital of France is", "Once upon a time", PREFIX + "What colour is the sky?", "1, 2, 3, 4,"]
PREFIX_PROMPT = PREFIX + "What is two plus two?"  # run after PROMPTS: its prefix is cached then
MAX_TOKENS = 8


@functools.lru_cache(maxsize=2)
def reference(device: str = "cpu") -> dict:
    """TP=1 outputs: {"batch": [token ids per PROMPTS], "prefix": token ids of PREFIX_PROMPT,
    "prefix_cached": its cached prompt tokens, "logprobs": (sample logprobs, prompt logprobs) of PROMPTS[0]}."""
    from shared_engine import LLM

    llm = LLM(**{**SETTINGS, "device": device})
    try:
        return run_cases(llm)
    finally:
        del llm
        gc.collect()


def run_cases(llm) -> dict:
    from shared_engine import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    batch = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    prefix = llm.generate([PREFIX_PROMPT], greedy, use_tqdm=False)[0]
    scored = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=3, logprobs=2, prompt_logprobs=1),
                          use_tqdm=False)[0]
    sample_lps = [{t: lp.logprob for t, lp in step.items()} for step in scored.outputs[0].logprobs]
    prompt_lps = [None if step is None else {t: lp.logprob for t, lp in step.items()}
                  for step in scored.prompt_logprobs]
    return {"batch": batch, "prefix": prefix.outputs[0].token_ids, "prefix_cached": prefix.num_cached_tokens,
            "logprobs": (sample_lps, prompt_lps)}
