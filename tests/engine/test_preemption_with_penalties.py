"""handed.md K14: preemption (recompute) and chunked prefill never change outputs or repeat tokens, also with
penalties (which count every output token, so a recompute that dropped or doubled one would change the next
choice) and with speculation on (a preempted request's accepted runs and its drafts' lookahead slots). Greedy
outputs under a pool far too small for the batch (24 blocks of 16 tokens for 8 requests: the scheduler preempts)
and 32-token prefill chunks equal those of an engine with room for every request and whole-prompt prefills
(ignore_eos: every request decodes its 40 tokens, so the pool runs out)."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams

PROMPTS = [
    "List three prime numbers and explain, step by step and in plain words, why each one is prime.",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "one two three four, one two three four, one two three four, one two",
    "Translate to French: The weather is lovely today and I would like to go for a walk in the park.",
    "The history of the printing press begins with the invention of movable type. Explain how it spread.",
    "a b c a b c a b c a b c a b",
    "Write a short poem about the sea, the wind and the lighthouse keeper who watches them both.",
]
# all three penalties on; the negative frequency penalty keeps repeats likely, so n-gram drafts get accepted
PENALTIES = SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.1, frequency_penalty=-0.3,
                           presence_penalty=0.2, min_tokens=5, ignore_eos=True)
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "policy": "always"}


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    llm = LLM(max_model_len=256)
    outs = llm.generate(PROMPTS, PENALTIES, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions_total == 0
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("speculative", [False, True])
def test_preemption_and_chunking_keep_penalised_outputs(reference, speculative):
    llm = LLM(num_gpu_blocks_override=24, block_size=16, max_model_len=256, max_num_batched_tokens=32,
              speculative_config=SPEC if speculative else None)
    outs = llm.generate(PROMPTS, PENALTIES, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert [o.outputs[0].token_ids for o in outs] == reference
    if speculative:
        assert llm.engine.stats.spec.num_accepted_tokens_total > 0


@pytest.mark.parametrize("speculative", [False, True])
def test_a_preempted_stream_never_repeats_or_takes_back_tokens(reference, speculative):
    """The same batch streamed step by step (every `RequestOutput`, as the server turns them into deltas): each
    request's outputs only ever extend the previous one -- a recompute after preemption re-emits nothing and
    drops nothing -- its text extends the text sent so far, and the last one is the reference."""
    llm = LLM(num_gpu_blocks_override=24, block_size=16, max_model_len=256, max_num_batched_tokens=32,
              speculative_config=SPEC if speculative else None)
    engine = llm.engine
    tok = llm.get_tokenizer()
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), tok.encode(prompt), PENALTIES)
    seen: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    sent: dict[str, str] = {rid: "" for rid in seen}
    preempted_while_streaming = False
    while engine.has_unfinished_requests():
        before = engine.scheduler.num_preemptions_total
        for out in engine.step():
            c = out.outputs[0]
            ids = list(c.token_ids)
            assert len(ids) > len(seen[out.request_id]) or out.finished, (out.request_id, ids)
            assert ids[:len(seen[out.request_id])] == seen[out.request_id], out.request_id
            safe = c.text if out.finished or c.stream_safe_len is None else c.text[:c.stream_safe_len]
            assert safe.startswith(sent[out.request_id]), out.request_id
            seen[out.request_id], sent[out.request_id] = ids, max(safe, sent[out.request_id], key=len)
        preempted_while_streaming |= engine.scheduler.num_preemptions_total > before and any(seen.values())
    assert preempted_while_streaming
    assert [seen[str(i)] for i in range(len(PROMPTS))] == reference
