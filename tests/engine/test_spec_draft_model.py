"""The `draft_model` method beyond greedy identity (test_spec_decode_greedy.py): the start-up tokenizer check,
and a draft KV cache that stays right where the target's is (the default model as its own draft keeps
accepting nearly everything) through preemption by recompute, prefix-cache hits and aborts."""

from __future__ import annotations

import json
import shutil

import pytest

from shared_engine import LLM, SamplingParams
from shared_engine.model_loader.model_source import resolve_model
from shared_engine.spec_decode.draft_tokenizer_check import check_same_tokenizer
from tests.engine.spec_cases import REPETITIVE, prompts

K = 4


def _self_draft(default_model_dir) -> dict:
    return {"method": "draft_model", "model": str(default_model_dir), "num_speculative_tokens": K,
            "policy": "always"}


def _acceptance(llm: LLM, before=(0, 0)) -> float:
    spec = llm.engine.stats.spec
    drafted, accepted = spec.num_draft_tokens_total - before[0], spec.num_accepted_tokens_total - before[1]
    assert drafted > 0
    return accepted / drafted


def _counts(llm: LLM) -> tuple[int, int]:
    return llm.engine.stats.spec.num_draft_tokens_total, llm.engine.stats.spec.num_accepted_tokens_total


def _ids(outputs) -> list[list[int]]:
    return [c.token_ids for o in outputs for c in o.outputs]


def test_tokenizer_check_names_both_models(default_model_dir):
    target = resolve_model(None)
    with pytest.raises(ValueError, match=r"draft model 'qwen3-0.6b' .* target model 'SmolLM2-135M-Instruct'.*"
                                         r"vocab_size 49152 vs 151936"):
        check_same_tokenizer(target, resolve_model("qwen3-0.6b", "dummy"))
    check_same_tokenizer(resolve_model("llama-3.1-8b", "dummy"), resolve_model("llama-3.2-1b", "dummy"))
    with pytest.raises(ValueError, match=r"vocab_size 128256 vs 49152; bos_token_id 128000 vs 1; eos_token_id"):
        check_same_tokenizer(resolve_model("llama-3.1-8b", "dummy"), resolve_model("smollm2-135m", "dummy"))
    check_same_tokenizer(target, resolve_model("smollm2-135m", "dummy"))  # same ids, no tokenizer to compare


def test_tokenizer_check_compares_vocabularies(default_model_dir, tmp_path):
    """Same vocabulary size and special tokens, two tokens' ids swapped: refused."""
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match=r"2 vocabulary entries differ, e.g. \['hello', 'world'\]"):
        check_same_tokenizer(resolve_model(None), resolve_model(str(tmp_path)))


def test_engine_refuses_a_mismatched_draft_at_start_up():
    with pytest.raises(ValueError, match="does not share the tokenizer"):
        LLM(max_model_len=256, kv_cache_memory=32 * 2**20,
            speculative_config={"method": "draft_model", "model": "qwen3-0.6b", "num_speculative_tokens": 2})


@pytest.fixture(scope="module")
def engines(default_model_dir):
    """Speculation off and the default model as its own draft, on a 20-block pool (320 tokens) that six
    32-token requests overflow: preemption by recompute."""
    small = {"max_model_len": 256, "num_gpu_blocks_override": 20, "max_num_seqs": 8}
    return LLM(**small), LLM(**small, speculative_config=_self_draft(default_model_dir))


def test_self_draft_through_preemption_and_prefix_hits(engines):
    off, on = engines
    batch = prompts()[:6]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    expected = _ids(off.generate(batch, params, use_tqdm=False))
    got = _ids(on.generate(batch, params, use_tqdm=False))
    assert got == expected
    assert on.engine.scheduler.num_preemptions_total > 0
    assert _acceptance(on) >= 0.9  # recomputed requests' draft KV was rebuilt by the mirrored prefill
    before = _counts(on)
    again = on.generate(batch[:2], params, use_tqdm=False)  # prefix-cache hits: blocks mirrored when computed
    assert _ids(again) == expected[:2] and sum(o.num_cached_tokens for o in again) > 0
    assert _acceptance(on, before) >= 0.9
    on.engine.block_manager.check_integrity()
    assert on.engine.block_manager.usage == 0.0


def test_abort_mid_run_with_a_draft(engines):
    off, on = engines
    params = SamplingParams(temperature=0.0, max_tokens=16)
    expected = _ids(off.generate(REPETITIVE[:3], params, use_tqdm=False))
    engine = on.engine
    ids = [on.get_tokenizer()(p)["input_ids"] for p in REPETITIVE[:3]]
    for i, prompt in enumerate(ids):
        engine.add_request(f"a{i}", prompt, params)
    final, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
        steps += 1
        if steps == 2:
            engine.abort_request("a1")  # mid-run, with drafts verified and a draft KV written
        engine.block_manager.check_integrity()
    assert final == {"a0": expected[0], "a2": expected[2]}
    assert not engine.block_manager.block_tables and engine.block_manager.usage == 0.0
