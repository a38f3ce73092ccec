"""handed.md K14 "a later turn of a session missing the cache" and K10 "prefix-cache hits reading 0 once
speculation is on": three sessions of three turns, each turn's prompt the previous turn's prompt and output
(token ids, as an agent resends them) plus a new message. Every later turn hits every whole block of the earlier
turn's prompt and output whose KV was computed (all positions but its last token's), exactly -- also the blocks
that decode steps and accepted draft runs filled, and with 32-token prefill chunks -- and its greedy output
equals an engine without prefix caching, with speculation off, k = 4 n-gram, suffix and self-draft-model
speculation, and n-gram with async scheduling."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams
from tests.engine.spec_cases import NUMBERS, REPETITIVE

BLOCK = 16
K = 4
COMMON = {"max_model_len": 512, "block_size": BLOCK, "max_num_batched_tokens": 32, "num_gpu_blocks_override": 128,
          "max_num_seqs": 16}
GREEDY = SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True)  # 23: turns end mid-block
SESSIONS = [NUMBERS, REPETITIVE[1], "Here is a short story about a lighthouse keeper and the sea:"]
MESSAGES = ["\nUser: go on, the same way.\nAssistant:", "\nUser: and again.\nAssistant:"]
ENGINES = ["cache", "ngram", "suffix", "draft", "ngram_async"]


def _spec(method: str, model=None) -> dict:
    config = {"method": method, "num_speculative_tokens": K, "policy": "always"}
    return config if model is None else {**config, "model": str(model)}


def _turns(llm: LLM) -> list[list[tuple[list[int], list[int], int]]]:
    """Per turn, per session: (prompt ids, output ids, cached tokens)."""
    tok = llm.get_tokenizer()
    prompts = [tok.encode(s) for s in SESSIONS]
    turns = []
    for turn in range(len(MESSAGES) + 1):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        turns.append([(p, o.outputs[0].token_ids, o.num_cached_tokens) for p, o in zip(prompts, outs)])
        if turn < len(MESSAGES):
            message = tok.encode(MESSAGES[turn], add_special_tokens=False)
            prompts = [p + list(o.outputs[0].token_ids) + message for p, o in zip(prompts, outs)]
    return turns


@pytest.fixture(scope="module")
def runs(default_model_dir):
    engines = {"no_cache": LLM(**COMMON, enable_prefix_caching=False), "cache": LLM(**COMMON),
               "ngram": LLM(**COMMON, speculative_config=_spec("ngram")),
               "suffix": LLM(**COMMON, speculative_config=_spec("suffix")),
               "draft": LLM(**COMMON, speculative_config=_spec("draft_model", default_model_dir)),
               "ngram_async": LLM(**COMMON, async_scheduling=True, speculative_config=_spec("ngram"))}
    return engines, {name: _turns(llm) for name, llm in engines.items()}


@pytest.mark.parametrize("engine", ENGINES)
def test_later_turns_hit_every_computed_block_and_answer_the_same(runs, engine):
    engines, turns = runs
    for turn, (got, want) in enumerate(zip(turns[engine], turns["no_cache"])):
        for session, ((prompt, output, cached), (ref_prompt, ref_output, _)) in enumerate(zip(got, want)):
            assert (prompt, output) == (ref_prompt, ref_output), (turn, session)
            if turn == 0:
                continue
            previous_prompt, previous_output, _ = turns[engine][turn - 1][session]
            computed = len(previous_prompt) + len(previous_output) - 1  # the last output token was never run
            assert cached == computed // BLOCK * BLOCK, (turn, session, cached, computed)
    llm = engines[engine]
    llm.engine.block_manager.check_integrity()
    if engine != "cache":
        assert llm.engine.stats.spec.num_accepted_tokens_total > 20


def test_speculation_and_chunks_were_exercised(runs):
    """The later turns' prompts are longer than a chunk, so their prefills ran in pieces without the cache; and an
    engine with no prefix caching reports no hits (the reference is a cold run)."""
    _, turns = runs
    assert all(len(prompt) > 32 for turn in turns["no_cache"][1:] for prompt, _, _ in turn)
    assert all(cached == 0 for turn in turns["no_cache"] for _, _, cached in turn)
