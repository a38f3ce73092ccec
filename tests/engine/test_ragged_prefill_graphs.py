"""The ragged prefill path (kernels/ragged_prefill_attention.py: a chunk's K/V from the step's k / v through TMA
descriptors) inside the engine on CUDA: mixed prefill + decode steps captured in CUDA graphs with it replay what
the eager step computes, and whole greedy generations equal the paged kernel's. RAGGED_PREFILL
(model_executor/attention/triton_backend.py) is on by default since these passed on an H100 at c6876ad."""

from __future__ import annotations

import random

import pytest
import torch

from shared_engine import LLM, SamplingParams
from shared_engine.model_executor.attention import triton_backend
from shared_engine.model_executor.input_builder import build_inputs
from tests.engine.test_cuda_graphs import BLOCK, LAYOUTS, assert_matches_eager, captured_runner, random_step

pytestmark = pytest.mark.gpu


def _record_ragged_calls(patch) -> list[int]:
    """Route the backend's ragged kernel through a recorder (`patch`: a MonkeyPatch); returns its call list."""
    calls, real = [], triton_backend.ragged_prefill_attention
    patch.setattr(triton_backend, "ragged_prefill_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.fixture(scope="module")
def ragged_runner(small_model_dir):
    """A runner whose graphs were captured with the ragged prefill kernel (fp32, as test_cuda_graphs: the cache holds
    k / v exactly, as with bf16); the capture must have launched it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_backend, "RAGGED_PREFILL", True)
        calls = _record_ragged_calls(patch)
        runner = captured_runner(small_model_dir)
        assert calls, "no captured graph launched the ragged kernel"
        yield runner


@pytest.mark.parametrize("num_decodes,chunks", [layout for layout in LAYOUTS if layout[1]])
def test_ragged_graph_step_equals_eager_step(ragged_runner, num_decodes, chunks, monkeypatch):
    runner = ragged_runner
    calls = _record_ragged_calls(monkeypatch)
    out = random_step(random.Random(num_decodes * 101 + len(chunks)), num_decodes, chunks)
    inputs = build_inputs(out, BLOCK, runner.device)
    key = runner.graph_runner.select(inputs.meta, inputs.input_ids.shape[0])
    assert key is not None and key[1] > 0  # a mixed graph (captured with the ragged kernel)
    for cache in runner.kv_caches:
        cache.normal_()
    before = [c.clone() for c in runner.kv_caches]
    with torch.inference_mode():
        eager = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta, runner.backend)
        assert calls, "the eager step did not run the ragged kernel"
        eager_caches = [c.clone() for c in runner.kv_caches]
        for cache, b in zip(runner.kv_caches, before):
            cache.copy_(b)
        graphed = runner.graph_runner.run(key, inputs.input_ids, inputs.positions, inputs.meta).clone()
    assert_matches_eager([graphed], eager, runner.kv_caches, eager_caches, before)


def test_ragged_generation_equals_paged(small_model_dir, monkeypatch):
    """Staggered prompts under a 64-token budget (most steps mix decodes with prefill chunks), CUDA graphs:
    greedy tokens with the ragged prefill kernel equal the paged kernel's (fp32, as test_cuda_graphs; the two tile
    a chunk differently, so their rows differ at rounding level: random prompts, not near-ties, as the graphs-vs-eager
    generation test assumes). Varlen graphs (speculative steps) are not covered here."""
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randrange(5, 300))] for _ in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    results = {}
    calls = _record_ragged_calls(monkeypatch)
    for ragged in (False, True):
        monkeypatch.setattr(triton_backend, "RAGGED_PREFILL", ragged)
        llm = LLM(str(small_model_dir), load_format="dummy", dtype="float32", max_model_len=1024, max_num_seqs=8,
                  max_num_batched_tokens=64, device="cuda")
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results[ragged] = [o.outputs[0].token_ids for o in outs]
        assert llm.engine.runner.mixed_graph_steps > 0 and bool(calls) == ragged
        del llm
        torch.cuda.empty_cache()
    assert results[True] == results[False]
