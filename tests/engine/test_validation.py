"""Bad input raises ValueError with a clear message, and the engine keeps serving afterwards."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams
from shared_engine.config import EngineConfig


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), load_format="dummy", max_model_len=128, num_gpu_blocks_override=32)


def still_serves(llm):
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 3
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("prompt, params, message", [
    ([], SamplingParams(), "prompt is empty"),
    ([5] * 100, SamplingParams(max_tokens=40),
     "maximum context length is 128 tokens.*140 tokens.*100 in the prompt, 40"),
    ([5] * 128, SamplingParams(max_tokens=None), "maximum context length is 128.*128 tokens"),
    ([999], SamplingParams(), r"token ids must be integers in \[0, 128\)"),
])
def test_bad_prompts(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], params, use_tqdm=False)
    still_serves(llm)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"max_tokens": -5}, "max_tokens must be at least 1"),
    ({"n": 0}, "n must be at least 1"),
    ({"temperature": -0.1}, "temperature must be non-negative"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"logprobs": 21}, "logprobs must be between 0 and 20"),
    ({"top_k": -2}, "top_k must be"),
    ({"min_p": 2.0}, "min_p must be in"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
])
def test_bad_sampling_params(llm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
    still_serves(llm)


def test_bad_batch_queues_nothing(llm):
    with pytest.raises(ValueError):
        llm.generate([[5, 6], []], SamplingParams(max_tokens=2), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    still_serves(llm)


def test_max_tokens_none_runs_to_context_limit(llm):
    out = llm.generate([[5] * 120], SamplingParams(max_tokens=None, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 8
    assert out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("settings, message", [
    ({"block_size": 12}, "block_size must be one of"),
    ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be > 0.0 and <= 1.0"),
    ({"no_such_setting": 1}, "unknown engine setting"),
    ({"dtype": "int8"}, "dtype must be one of"),
])
def test_config_errors_name_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_flat(**settings)


def test_refuses_max_model_len_that_cannot_fit(tiny_model_dir):
    with pytest.raises(ValueError, match="max_model_len 512 tokens does not fit in the KV cache"):
        LLM(str(tiny_model_dir), load_format="dummy", max_model_len=512, num_gpu_blocks_override=4)


def test_capacity_line_is_logged(tiny_model_dir, caplog):
    with caplog.at_level("INFO", logger="shared_engine"):
        LLM(str(tiny_model_dir), load_format="dummy", max_model_len=256, num_gpu_blocks_override=40)
    assert "KV cache size: 640 tokens, maximum concurrency for 256 tokens per request: 2.50x" in caplog.text
