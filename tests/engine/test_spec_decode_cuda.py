"""CUDA: speculative decodes (query length k + 1) replay the mixed CUDA graphs and verify with the Triton
accept kernel; greedy outputs equal speculation off (fp32, so the k + 1-query attention path and the decode
kernel agree to far below an argmax gap), also with async scheduling on."""

from __future__ import annotations

import pytest

from shared_engine import LLM
from tests.engine.spec_cases import NUMBERS, REPETITIVE, code_prompts, greedy

pytestmark = pytest.mark.gpu

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "policy": "always"}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_greedy_identity_on_cuda_with_graphs(async_scheduling):
    common = {"max_model_len": 1024, "dtype": "float32", "device": "cuda", "max_num_seqs": 16,
              "async_scheduling": async_scheduling, "gpu_memory_utilization": 0.3}
    prompts = REPETITIVE + code_prompts()[:4]
    cases = [(p, greedy(24)) for p in prompts] + [(NUMBERS, greedy(m)) for m in (1, 2, 7, 13)] + [
        (NUMBERS, greedy(stop=["4,"])), (NUMBERS, greedy(stop_token_ids=[37]))]
    results = {}
    for name, extra in (("off", {}), ("on", {"speculative_config": NGRAM})):
        llm = LLM(**common, **extra)
        outs = llm.generate([p for p, _ in cases], [s for _, s in cases], use_tqdm=False)
        results[name] = [(c.token_ids, c.text, c.finish_reason) for o in outs for c in o.outputs]
        if name == "on":
            engine = llm.engine
            assert engine.stats.spec.num_accepted_tokens_total > 50
            assert engine.runner.graph_steps > 0 and engine.runner.mixed_graph_steps > 0
        del llm
    assert results["on"] == results["off"]
