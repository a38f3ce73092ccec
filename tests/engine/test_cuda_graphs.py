"""CUDA graphs replay exactly what the eager forward computes: decode-only and mixed prefill + decode steps
(padding rows, cached prefixes, several chunks), and whole greedy generations with graphs on vs off; the
same for cascade attention (decodes sharing a prefix-cached prompt prefix) against plain decode attention."""

from __future__ import annotations

import dataclasses
import gc
import random

import pytest
import torch

from shared_engine import LLM, SamplingParams
from shared_engine.config import EngineConfig
from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_executor.attention.cascade import CASCADE_MIN_DECODES
from shared_engine.model_executor.cuda_graph_runner import mixed_buckets
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.model_executor.model_runner import ModelRunner
from shared_engine.model_loader.model_source import resolve_model

pytestmark = pytest.mark.gpu
BLOCK = 16


def captured_runner(model_dir) -> ModelRunner:
    """fp32 dummy weights on CUDA, 600 KV blocks, every CUDA graph captured (the graph tests' runner)."""
    config = EngineConfig.from_flat(model=str(model_dir), load_format="dummy", dtype="float32",
                                    max_model_len=1024, max_num_seqs=24, max_num_batched_tokens=256,
                                    device="cuda")
    runner = ModelRunner(config, resolve_model(str(model_dir), "dummy", None))
    runner.allocate_kv_cache(600)
    runner.capture_cuda_graphs()
    return runner


@pytest.fixture(scope="module")
def runner(small_model_dir):
    return captured_runner(small_model_dir)


def random_step(rng: random.Random, num_decodes: int, chunks: list[tuple[int, int]]) -> SchedulerOutput:
    """Decodes at random contexts, then prefill chunks (cached prefix length, chunk length); each sequence
    owns distinct random blocks."""
    free = list(range(1, 600))
    rng.shuffle(free)
    scheduled = []

    def add(start: int, n: int) -> None:
        blocks = [free.pop() for _ in range(-(-(start + n) // BLOCK))]
        request = Request(f"r{len(scheduled)}", [3] * (start + n), SamplingParams(max_tokens=1), max_tokens=1)
        ids = [rng.randrange(1024) for _ in range(n)]
        scheduled.append(ScheduledRequest(request, ids, start, blocks, True))

    for _ in range(num_decodes):
        add(rng.randrange(1, 300), 1)
    for prefix, n in chunks:
        add(prefix, n)
    return SchedulerOutput(scheduled, num_batched_tokens=sum(s.num_new_tokens for s in scheduled))


LAYOUTS = [
    (5, []),  # decode-only, padded to 8
    (3, [(0, 40)]),  # one fresh prompt
    (7, [(32, 100), (0, 17)]),  # a cached prefix (block multiple) and a fresh chunk
    (0, [(5, 60), (0, 1), (200, 30)]),  # prefill only; a one-token chunk
    (20, [(0, 130), (48, 64), (0, 33), (16, 2)]),  # decodes padded to the max bucket
]


@pytest.mark.parametrize("num_decodes,chunks", LAYOUTS)
def test_graph_step_equals_eager_step(runner, num_decodes, chunks):
    rng = random.Random(num_decodes * 101 + len(chunks))
    out = random_step(rng, num_decodes, chunks)
    inputs = build_inputs(out, BLOCK, runner.device)
    key = runner.graph_runner.select(inputs.meta, inputs.input_ids.shape[0])
    assert key is not None and key[0] >= num_decodes and (key[1] > 0) == bool(chunks)
    for cache in runner.kv_caches:
        cache.normal_()  # cached prefixes hold arbitrary K/V
    caches_before = [c.clone() for c in runner.kv_caches]
    with torch.inference_mode():
        eager = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta, runner.backend)
        eager_caches = [c.clone() for c in runner.kv_caches]
        for cache, before in zip(runner.kv_caches, caches_before):
            cache.copy_(before)
        graphed = runner.graph_runner.run(key, inputs.input_ids, inputs.positions, inputs.meta).clone()
    assert graphed.shape == eager.shape
    assert_matches_eager([graphed], eager, runner.kv_caches, eager_caches, caches_before)


def assert_matches_eager(results, eager, caches, eager_caches, caches_before) -> None:
    """Each of `results` (hidden states) agrees with the eager step's row by row, and `caches` hold what the
    eager step wrote and nothing else. Triton's fp32 tl.dot runs in TF32 and graph grids split the context
    differently (sized for max_model_len; cascade merges the prefix through its log-sum-exp), so rows agree to
    ~1e-3 relative; a wrong layout or prefix is off by O(1)."""
    for result in results:
        row_error = (result - eager).norm(dim=-1) / eager.norm(dim=-1)
        assert row_error.max().item() < 2e-3, row_error
    for cache, eager_cache, before in zip(caches, eager_caches, caches_before):
        written = eager_cache != before
        assert torch.equal(cache[~written], before[~written])  # padding rows wrote nothing
        torch.testing.assert_close(cache[written], eager_cache[written], rtol=1e-2, atol=1e-2)


def test_too_many_chunks_or_tokens_run_eagerly(runner):
    rng = random.Random(0)
    nine_chunks = random_step(rng, 2, [(0, 8)] * 9)
    inputs = build_inputs(nine_chunks, BLOCK, runner.device)
    assert runner.graph_runner.select(inputs.meta, inputs.input_ids.shape[0]) is None
    decode, prefill = mixed_buckets(24, 256)
    assert decode[-1] == 24 and prefill[-1] == 256 and mixed_buckets(24, 0) == ([], [])


def test_greedy_generation_graphs_equal_eager(small_model_dir):
    """Staggered prompt lengths under a 64-token budget: most steps mix decodes with prefill chunks."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randrange(5, 300))] for _ in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    results = {}
    for eager in (True, False):
        llm = LLM(str(small_model_dir), load_format="dummy", dtype="float32", max_model_len=1024,
                  max_num_seqs=8, max_num_batched_tokens=64, enforce_eager=eager, device="cuda")
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results[eager] = [o.outputs[0].token_ids for o in outs]
        if not eager:
            runner = llm.engine.runner
            assert runner.mixed_graph_steps > 0 and runner.graph_steps > runner.mixed_graph_steps
        del llm
        torch.cuda.empty_cache()
    assert results[False] == results[True]


# ---- cascade attention -------------------------------------------------------------------------------
NUM_SHARED = 20  # blocks: a 320-token prefix-cached prompt prefix, over CASCADE_MIN_PREFIX_TOKENS


def shared_prefix_step(rng: random.Random, num_decodes: int, chunks: list[tuple[int, int]]) -> SchedulerOutput:
    """Decodes whose block tables begin with the same NUM_SHARED random blocks, then 1-199 suffix tokens
    over blocks of their own; then prefill chunks (cached prefix length, chunk length) over their own."""
    free = list(range(1, 600))
    rng.shuffle(free)
    shared = [free.pop() for _ in range(NUM_SHARED)]
    scheduled = []
    for s in range(num_decodes):
        context = NUM_SHARED * BLOCK + rng.randrange(1, 200)
        blocks = shared + [free.pop() for _ in range(-(-context // BLOCK) - NUM_SHARED)]
        request = Request(f"d{s}", [3] * context, SamplingParams(max_tokens=1), max_tokens=1)
        scheduled.append(ScheduledRequest(request, [rng.randrange(1024)], context - 1, blocks, True))
    for c, (start, n) in enumerate(chunks):
        blocks = [free.pop() for _ in range(-(-(start + n) // BLOCK))]
        request = Request(f"p{c}", [3] * (start + n), SamplingParams(max_tokens=1), max_tokens=1)
        scheduled.append(ScheduledRequest(request, [rng.randrange(1024) for _ in range(n)], start, blocks, True))
    return SchedulerOutput(scheduled, num_batched_tokens=sum(s.num_new_tokens for s in scheduled))


def without_cascade(meta):
    return dataclasses.replace(meta, prefix_len=None, prefix_blocks=None, max_prefix_len=0, backend_cache={})


CASCADE_LAYOUTS = [
    (8, []),  # the smallest cascade bucket, no padding
    (13, []),  # padded to 16: padding rows' context 1 is shorter than the prefix
    (24, []),  # max_num_seqs
    (9, [(0, 40)]),  # mixed: decodes padded to 16, a fresh prompt
    (20, [(32, 100), (0, 17)]),  # mixed: decodes padded to 24, a cached prefix and a fresh chunk
]


def test_cascade_graphs_only_where_they_can_pay(runner):
    graphs = runner.graph_runner.graphs
    assert runner.enable_cascade  # CUDA, prefix caching on (the default), cascade not disabled
    assert all(d >= CASCADE_MIN_DECODES for d, _, cascade, _ in graphs if cascade)
    for d, t, _, lora in list(graphs):
        assert (d, t, True, lora) in graphs or d < CASCADE_MIN_DECODES
        assert not lora  # no LoRA engine: no graph with LoRA layers
    assert any(t > 0 for _, t, cascade, _ in graphs if cascade)  # mixed graphs have cascade variants too


@pytest.mark.parametrize("num_decodes,chunks", CASCADE_LAYOUTS)
def test_cascade_graph_step_equals_eager_step(runner, num_decodes, chunks):
    """The cascade graph replay, the eager cascade step and the eager plain-decode step agree, and the graph
    writes exactly the eager step's KV slots."""
    rng = random.Random(num_decodes * 7 + len(chunks))
    out = shared_prefix_step(rng, num_decodes, chunks)
    inputs = build_inputs(out, BLOCK, runner.device, cascade=True)
    meta, plain = inputs.meta, without_cascade(inputs.meta)
    assert meta.use_cascade and meta.prefix_len.item() == NUM_SHARED * BLOCK
    num_tokens = inputs.input_ids.shape[0]
    key = runner.graph_runner.select(meta, num_tokens)
    assert key is not None and key[2] and key[0] >= num_decodes and (key[1] > 0) == bool(chunks)
    assert runner.graph_runner.select(plain, num_tokens) == (key[0], key[1], False, False)
    for cache in runner.kv_caches:
        cache.normal_()  # the shared prefix and the suffixes hold arbitrary K/V
    caches_before = [c.clone() for c in runner.kv_caches]

    def restore() -> None:
        for cache, before in zip(runner.kv_caches, caches_before):
            cache.copy_(before)

    with torch.inference_mode():
        eager = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, plain, runner.backend)
        eager_caches = [c.clone() for c in runner.kv_caches]
        restore()
        eager_cascade = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, meta, runner.backend)
        restore()
        graphed = runner.graph_runner.run(key, inputs.input_ids, inputs.positions, inputs.meta).clone()
    assert graphed.shape == eager.shape == eager_cascade.shape
    assert_matches_eager([eager_cascade, graphed], eager, runner.kv_caches, eager_caches, caches_before)


def test_greedy_generation_cascade_equals_no_cascade(small_model_dir):
    """16 requests share a 300-token prompt prefix (18 full blocks = 288 prefix-cached tokens), then
    suffixes of their own, under a 64-token budget: once 8 of them decode, every step until fewer than 8
    remain runs cascade attention, first mixed with the later requests' prefill chunks, then decode-only.
    Tokens equal those with `disable_cascade_attn`, with graphs and eagerly."""
    rng = random.Random(2)
    prefix = [rng.randrange(3, 1024) for _ in range(300)]
    prompts = [prefix + [rng.randrange(3, 1024) for _ in range(rng.randrange(5, 80))] for _ in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    results = {}
    for disable, eager in ((True, False), (False, False), (False, True)):
        llm = LLM(str(small_model_dir), load_format="dummy", dtype="float32", max_model_len=1024,
                  max_num_seqs=16, max_num_batched_tokens=64, enable_prefix_caching=True,
                  disable_cascade_attn=disable, enforce_eager=eager, device="cuda",
                  num_gpu_blocks_override=1024)  # a fixed pool: not sized from what earlier LLMs left free
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results[disable, eager] = [o.outputs[0].token_ids for o in outs]
        runner = llm.engine.runner
        if disable:
            assert runner.cascade_steps == 0
            assert not any(cascade for _, _, cascade in runner.graph_runner.graphs)
        elif eager:
            assert runner.cascade_steps > 0 and runner.graph_runner is None
        else:
            # measured on the CPU with the same schedule: 24 of 43 steps, 8 of them with prefill chunks
            assert runner.cascade_graph_steps > 0 and runner.cascade_steps >= runner.cascade_graph_steps
        del llm, runner  # the runner holds the model and KV cache: free both before the next LLM
        gc.collect()
        torch.cuda.empty_cache()
    assert results[False, False] == results[True, False]
    assert results[False, True] == results[True, False]


def test_async_output_processing_and_async_scheduling_on_cuda_equal_sync(small_model_dir):
    """`enable_async_output_proc` on CUDA: the runner launches step n+1 (graph replay, sampling, the sampled
    ids' copy to pinned memory) before step n's outputs are processed and collects it on the next call;
    `async_scheduling` also launches it before step n is collected, its decode inputs read on the device
    from step n's sampled ids. Greedy, seeded random with logprobs, and prompt logprobs under chunked prefill
    give what the synchronous engine gives, with graphs; every step is timed on the device."""
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randrange(5, 150))] for _ in range(12)]
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=20, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, prompt_logprobs=1)]
    results = {}
    for mode in ("sync", "async_output", "async_scheduling"):
        llm = LLM(str(small_model_dir), load_format="dummy", dtype="float32", max_model_len=1024,
                  max_num_seqs=16, max_num_batched_tokens=64, enable_async_output_proc=mode == "async_output",
                  async_scheduling=mode == "async_scheduling", device="cuda", num_gpu_blocks_override=1024)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [params[i % 3] for i in range(12)],
                            use_tqdm=False)
        results[mode] = [(o.outputs[0].token_ids,
                          [sorted((t, round(lp.logprob, 3)) for t, lp in e.items())
                           for e in o.outputs[0].logprobs or []],
                          [sorted(e or {}) for e in o.prompt_logprobs or []]) for o in outs]
        runner = llm.engine.runner
        assert runner.graph_steps > 0 and runner.gpu_span_seconds > 0
        del llm, runner
        gc.collect()
        torch.cuda.empty_cache()
    assert results["async_output"] == results["sync"]
    assert results["async_scheduling"] == results["sync"]
