"""handed.md K14: a later turn of a session must neither miss the cache its earlier turn filled nor reuse a
block that the earlier turn's abort left half-written. Turn 1 (a ~300-token prompt, 48-token prefill chunks)
is aborted after some of its chunks ran, or with a chunk scheduled whose KV was never written; turn 2 (turn 1's
prompt plus more) then gives the greedy output of an engine without prefix caching, hits exactly the whole blocks
turn 1 computed (no more: an unwritten block is never a hit), and the block accounting stays consistent."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
TURN1 = ("You are the coding agent. The repository's scheduler keeps a waiting queue and a running list; "
         "each step it admits requests while the token budget and the KV blocks allow, chunks long prompts, "
         "and preempts the newest request when a decode cannot get a block. ") * 4
TURN2 = "\nTool output: tests passed. What should change next?"
BLOCK = 16
CHUNK = 48


def _llm(caching: bool) -> LLM:
    return LLM(enable_prefix_caching=caching, max_model_len=1024, max_num_batched_tokens=CHUNK, block_size=BLOCK,
               kv_cache_memory=64 * 2**20)


@pytest.fixture(scope="module")
def reference():
    off = _llm(False)
    tok = off.get_tokenizer()
    turn1, turn2 = tok.encode(TURN1), tok.encode(TURN1 + TURN2)
    assert turn2[:len(turn1)] == turn1 and len(turn1) > 4 * CHUNK
    return turn1, turn2, off.generate([turn2], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("chunks_run", [1, 2, 4])
@pytest.mark.parametrize("in_flight", [False, True])
def test_abort_mid_prefill_then_next_turn(reference, chunks_run, in_flight):
    turn1, turn2, expected = reference
    llm = _llm(True)
    engine = llm.engine
    engine.add_request("turn1", turn1, GREEDY)
    for _ in range(chunks_run):  # whole steps: scheduled, run, their KV written
        out = engine.scheduler.schedule()
        engine.runner.execute(out)
        engine.scheduler.update_from_output(out, {}, 0.0)
    if in_flight:  # one more chunk scheduled (its blocks allocated) but never run
        engine.scheduler.schedule()
    engine.abort_request(["turn1"])
    engine.block_manager.check_integrity()
    hit = llm.generate([turn2], GREEDY, use_tqdm=False)[0]
    assert hit.outputs[0].token_ids == expected
    assert hit.num_cached_tokens == (chunks_run * CHUNK) // BLOCK * BLOCK  # the written whole blocks, no more
    engine.block_manager.check_integrity()
