"""CUDA: speculative decodes (query length k + 1) replay the mixed CUDA graphs and verify with the Triton
accept kernel; greedy outputs equal speculation off (fp32 dummy weights of a small Llama, so the k + 1-query
attention path and the decode kernel agree far below an argmax gap), with async scheduling off and on. The
drafts come from the benchmark `replay` proposer (the recorded greedy outputs, each token right with
probability 0.7), since dummy weights give n-gram drafts nothing to match."""

from __future__ import annotations

import random

import pytest

from shared_engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _free_engines():
    """Each test's engines leave the device before the next sizes its KV cache by `gpu_memory_utilization`
    (the memory profile counts every live tensor in the process: an engine kept by a reference cycle left the
    next one 0 blocks on the H200 at 9a99c62)."""
    yield
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_greedy_identity_on_cuda_with_graphs(small_model_dir, async_scheduling):
    common = {"load_format": "dummy", "dtype": "float32", "max_model_len": 1024, "max_num_seqs": 16,
              "async_scheduling": async_scheduling, "gpu_memory_utilization": 0.2}
    rng = random.Random(1)
    prompts = [[rng.randint(3, 1000) for _ in range(rng.randint(5, 300))] for _ in range(12)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 1, 2, 7, 13, 40) * 2]
    off = LLM(str(small_model_dir), **common)
    expected = [o.outputs[0].token_ids for o in off.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                               use_tqdm=False)]
    del off
    on = LLM(str(small_model_dir), **common, speculative_config={
        "method": "replay", "num_speculative_tokens": 5, "policy": "always", "acceptance_rate": 0.7})
    for p, out in zip(prompts, expected):
        on.engine.spec.proposer.record(p, out)
    got = [o.outputs[0].token_ids for o in on.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                        use_tqdm=False)]
    assert got == expected
    engine = on.engine
    assert engine.stats.spec.num_accepted_tokens_total > 50
    assert engine.runner.graph_steps > 0 and engine.runner.mixed_graph_steps > 0
    assert engine.runner.varlen_graph_steps > 0  # the steps of 9-12 speculative decodes (72 rows > 16)
    assert engine.runner.decode_row_steps > 0  # the steps of 1-2 (decode rows in the decode graphs)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_forced_acceptance_on_cuda_emits_the_recording(small_model_dir, async_scheduling):
    """BENCHMARK-ONLY forced acceptance through the Triton accept kernel and the CUDA graphs, bf16 as in the
    H200 benchmark: a random recording (nothing the model would produce) comes out after the prefill's token."""
    rng = random.Random(2)
    prompts = [[rng.randint(3, 1000) for _ in range(rng.randint(5, 300))] for _ in range(12)]
    recorded = [[rng.randint(3, 1000) for _ in range(40)] for _ in prompts]
    llm = LLM(str(small_model_dir), load_format="dummy", max_model_len=1024, max_num_seqs=16,
              async_scheduling=async_scheduling, gpu_memory_utilization=0.2, benchmark_forced_acceptance=True,
              speculative_config={"method": "replay", "num_speculative_tokens": 5, "policy": "always",
                                  "acceptance_rate": 0.7})
    for p, t in zip(prompts, recorded):
        llm.engine.spec.proposer.record(p, t)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids)[1:] for o in outs] == [t[1:] for t in recorded]
    spec = llm.engine.stats.spec
    assert abs(spec.accepted_per_pos_total[0] / spec.num_drafts_total - 0.7) < 0.12
    assert llm.engine.runner.graph_steps > 0


def test_memory_profile_counts_the_draft_model(small_model_dir):
    """The memory profile's peak holds the draft's weights and its profiling pass: with the model as its own
    draft the peak grows by at least the draft's weight bytes (engine with the draft built first, so memory
    a freed engine leaves behind could only shrink the difference)."""
    import gc

    import torch

    common = {"load_format": "dummy", "dtype": "float32", "max_model_len": 1024, "max_num_seqs": 16,
              "gpu_memory_utilization": 0.3}
    with_draft = LLM(str(small_model_dir), **common, speculative_config={
        "method": "draft_model", "model": str(small_model_dir), "num_speculative_tokens": 3})
    peak_draft = with_draft.engine.runner.profiled_peak_bytes
    draft = with_draft.engine.runner.draft_runner
    draft_bytes = sum(p.numel() * p.element_size() for p in draft.model.parameters())
    num_blocks, per_block = draft.num_blocks, with_draft.engine.runner.kv_bytes_per_block + draft.kv_bytes_per_block
    del with_draft, draft
    gc.collect()
    torch.cuda.empty_cache()
    plain = LLM(str(small_model_dir), **common)
    assert peak_draft - plain.engine.runner.profiled_peak_bytes >= draft_bytes
    plain_kv_bytes = plain.engine.block_manager.num_blocks * plain.engine.runner.kv_bytes_per_block
    assert num_blocks < plain_kv_bytes / per_block  # the draft's weights, scratch and blocks all paid for


def test_fused_draft_proposals_replay_one_graph_and_draft_as_step_by_step(small_model_dir, monkeypatch):
    """The draft model's multi-step proposal graphs (spec_decode/fused_proposal.py): with the fp32 dummy model
    as its own draft, proposals replay one graph for their decode-shaped steps (all k, or the k - 1 after a
    step 0 that computes the verified positions' draft KV) and draft exactly the tokens of the step-by-step
    path (SPEC_FUSED_PROPOSAL=0), proposal by proposal; outputs are the same."""
    import gc

    import torch

    common = {"load_format": "dummy", "dtype": "float32", "max_model_len": 1024, "max_num_seqs": 16,
              "gpu_memory_utilization": 0.2}
    spec = {"method": "draft_model", "model": str(small_model_dir), "num_speculative_tokens": 4, "policy": "always"}
    rng = random.Random(3)
    groups = [[[rng.randint(3, 1000) for _ in range(rng.randint(5, 300))] for _ in range(n)] for n in (4, 1)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runs = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("SPEC_FUSED_PROPOSAL", fused)
        llm = LLM(str(small_model_dir), **common, speculative_config=spec)
        proposer, log = llm.engine.spec.proposer, []
        original = proposer.propose
        proposer.propose = lambda requests, caps, log=log, original=original: (
            log.append(original(requests, caps)) or log[-1])
        outs = [[o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in g], params,
                                                                use_tqdm=False)] for g in groups]
        draft = llm.engine.runner.draft_runner
        runs[fused] = (outs, [[list(d) for d in drafts] for drafts in log], draft.num_fused_proposals,
                       draft.propose_gpu_seconds, draft.first_step_gpu_seconds, draft.num_deferred_steps,
                       draft.num_mirror_forwards)
        del llm, proposer, draft
        gc.collect()
        torch.cuda.empty_cache()
    assert runs["1"][0] == runs["0"][0]
    assert runs["1"][1] == runs["0"][1]
    assert runs["1"][2] >= 6 and runs["0"][2] == 0  # ~5 proposals per group at full acceptance
    assert runs["1"][3] > 0  # the proposals' device time was measured
    # speculative steps ran no mirror forward: their draft KV came in the next proposal's step 0 (timed alone)
    assert runs["1"][4] > 0 and runs["1"][5] >= 6 and runs["1"][6] < runs["1"][5]
