"""Tensor parallelism on the CPU: two ranks (two processes, gloo) against one process, on the default
model (SmolLM2-135M-Instruct, fp32; 9 query / 3 KV heads, so TP=2 splits the KV heads 2 / 1 and the
query heads 6 / 3). Greedy tokens must be identical, with chunked prefill and prefix-cache hits, and
logprobs equal to fp32 rounding (the all-reduce sums the partial products in another order)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from shared_engine import LLM, SamplingParams
from shared_engine.distributed.parallel_state import get_tp_world_size
from shared_engine.entrypoints.openai.async_engine import AsyncEngine
from tests.engine.tp_cases import PROMPTS, SETTINGS, reference, run_cases


@pytest.fixture(scope="module")
def ref(default_model_dir) -> dict:
    return reference()


@pytest.fixture(scope="module")
def tp_llm(ref):  # after the reference: one engine of either kind per process at a time
    llm = LLM(tensor_parallel_size=2, **SETTINGS)
    yield llm
    llm.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def tp_out(tp_llm) -> dict:
    return run_cases(tp_llm)


def test_two_ranks_give_the_single_process_greedy_tokens(ref, tp_out, tp_llm):
    assert tp_llm.engine.runner.workers and get_tp_world_size() == 2  # really two processes
    prompt_lens = [len(tp_llm.get_tokenizer()(p).input_ids) for p in PROMPTS]
    assert max(prompt_lens) > SETTINGS["max_num_batched_tokens"]  # one prompt was prefilled in chunks
    assert tp_out["batch"] == ref["batch"]


def test_prefix_cache_hit_under_tensor_parallelism(ref, tp_out):
    assert tp_out["prefix_cached"] == ref["prefix_cached"] >= 2 * SETTINGS["block_size"]
    assert tp_out["prefix"] == ref["prefix"]


def test_logprobs_and_prompt_logprobs_match(ref, tp_out):
    (ref_sample, ref_prompt), (tp_sample, tp_prompt) = ref["logprobs"], tp_out["logprobs"]
    assert [sorted(s) for s in tp_sample] == [sorted(s) for s in ref_sample]
    assert tp_prompt[0] is None and ref_prompt[0] is None
    for got, want in zip(tp_sample + tp_prompt[1:], ref_sample + ref_prompt[1:], strict=True):
        assert got.keys() == want.keys()
        for token, value in want.items():
            assert got[token] == pytest.approx(value, abs=1e-4)


def test_kv_cache_holds_each_ranks_heads_only(tp_llm):
    runner = tp_llm.engine.runner.runner  # rank 0's ModelRunner
    assert runner.num_kv_heads == 2 and runner.kv_caches[0].shape[3] == 2  # KV heads 0-1 of 3
    attn = runner.model.model.layers[0].self_attn
    assert (attn.num_heads, attn.qkv_proj.weight.shape[0]) == (6, (6 + 2 * 2) * 64)
    assert runner.model.lm_head.weight.shape[0] == 49152 // 2


def test_one_all_reduce_per_attention_and_mlp_block(tp_llm, monkeypatch):
    """One step (a 5-token prefill that samples once) on rank 0: 2 all-reduces per layer (o_proj, down_proj),
    one for the embedding, one all-gather of the logits."""
    from shared_engine.model_executor.layers import parallel_linear, vocab_parallel_embedding

    calls = {"all_reduce": 0, "all_gather": 0}

    def counting(name, real):
        def wrapper(x):
            calls[name] += 1
            return real(x)
        return wrapper

    monkeypatch.setattr(parallel_linear, "tp_all_reduce", counting("all_reduce", parallel_linear.tp_all_reduce))
    monkeypatch.setattr(vocab_parallel_embedding, "tp_all_reduce",
                        counting("all_reduce", vocab_parallel_embedding.tp_all_reduce))
    monkeypatch.setattr(vocab_parallel_embedding, "tp_all_gather",
                        counting("all_gather", vocab_parallel_embedding.tp_all_gather))
    tp_llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    assert calls == {"all_reduce": 2 * 30 + 1, "all_gather": 1}


def test_worker_death_fails_the_engine_not_hangs(tp_llm):
    """Last in the module: it kills the shared engine's worker, while idle. The in-thread server engine
    (`--disable-frontend-multiprocessing`) turns unhealthy at once; the next offline step raises."""

    async def scenario():
        served = AsyncEngine(tp_llm.engine)
        served.start(asyncio.get_running_loop())
        assert served.healthy
        tp_llm.engine.runner.workers[1].kill()
        for _ in range(200):  # the monitor thread reports within milliseconds; 10 s at most
            if not served.healthy:
                break
            await asyncio.sleep(0.05)
        served.shutdown()
        return served.healthy, served.error

    healthy, error = asyncio.run(scenario())
    assert not healthy and "rank 1" in str(error)
    with pytest.raises(RuntimeError, match="rank 1"):
        tp_llm.generate(["Hello"], SamplingParams(max_tokens=2), use_tqdm=False)
