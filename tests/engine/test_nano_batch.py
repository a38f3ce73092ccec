"""Nano-batch overlap (model_executor/nano_batch.py, issue 23): a large decode step split into two nano-batches
computes what the whole step computes. On the CPU the nano-batches run one after the other through the torch
backend (the same split, metadata slices and attention turn-taking as on CUDA, without streams); the `gpu` test
checks the two-stream CUDA-graph capture against the plain graphs."""

from __future__ import annotations

import random

import pytest
import torch

from shared_engine import LLM, SamplingParams
from shared_engine.config import DeviceConfig
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.nano_batch import (
    NanoBatchForward,
    _AttentionTurns,
    _SequentialOps,
    slice_decodes,
    split_point,
)

PROMPTS = [
    "List three prime numbers and explain why each one is prime.",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "one two three four, one two three four, one two",
    "Translate to French: The weather is lovely today.",
    "The history of the printing press begins with",
    "a b c a b c a b c a b",
    "Write a short poem about the sea.",
    "The capital of France is",
    "Explain what a KV cache is, in one paragraph:",
]
# 20 sequences: decode steps of 16-20 rows, split 8 + 8..12
PROMPTS = PROMPTS + [p + " And then" for p in PROMPTS]


@pytest.mark.parametrize("rows, expected", [(16, 8), (17, 8), (24, 8), (32, 16), (100, 48), (448, 224), (512, 256)])
def test_split_point_halves_rounded_down_to_eight_rows(rows, expected):
    assert split_point(rows) == expected


def test_split_point_refuses_fewer_than_sixteen_rows():
    with pytest.raises(ValueError, match="too small"):
        split_point(15)


def test_slice_decodes_rebases_the_query_offsets():
    n = 6
    meta = AttentionMetadata(
        slot_mapping=torch.arange(10, 10 + n), block_tables=torch.arange(n * 3, dtype=torch.int32).view(n, 3),
        context_lens=torch.tensor([5, 6, 7, 8, 9, 10], dtype=torch.int32),
        cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32), num_decodes=n, max_context_len=10, max_query_len=1,
        context_lens_list=[5, 6, 7, 8, 9, 10], query_lens_list=[1] * n)
    part = slice_decodes(meta, 2, 5)
    assert part.num_decodes == part.num_seqs == 3
    assert part.slot_mapping.tolist() == [12, 13, 14]
    assert part.block_tables.tolist() == [[6, 7, 8], [9, 10, 11], [12, 13, 14]]
    assert part.context_lens.tolist() == [7, 8, 9] and part.context_lens_list == [7, 8, 9]
    assert part.cu_seqlens_q.tolist() == [0, 1, 2, 3]


def test_attention_turns_alternate_between_nano_batches():
    calls = []

    class Backend:
        def forward(self, tag):
            calls.append(tag)
            return tag

    turns = _AttentionTurns(Backend(), num_parts=2, events=[None] * 6, ops=_SequentialOps())
    a, b = turns.for_part(0), turns.for_part(1)
    for layer in range(3):
        assert a.forward(("A", layer)) == ("A", layer)
        b.forward(("B", layer))
    assert calls == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    assert turns.calls == [3, 3]


def test_config_refuses_a_split_of_one_row():
    for bad in (1, 15, -2):
        with pytest.raises(ValueError, match="nano_batch_min_decodes"):
            DeviceConfig(nano_batch_min_decodes=bad)
    assert DeviceConfig(nano_batch_min_decodes=16).nano_batch_min_decodes == 16
    with pytest.raises(ValueError, match="at least 16"):
        NanoBatchForward(model=None, min_decodes=8)


def test_tensor_parallelism_is_refused_before_any_rank_starts():
    from shared_engine.config import EngineConfig
    from shared_engine.distributed.tp_executor import make_model_runner

    config = EngineConfig.from_flat(nano_batch_min_decodes=16, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        make_model_runner(config, source=None)


def test_applies_only_to_large_decode_only_layouts():
    nano = NanoBatchForward(model=None, min_decodes=16)

    def meta(num_decodes, num_seqs, cascade=False):
        m = AttentionMetadata(
            slot_mapping=torch.zeros(0), block_tables=torch.zeros(0), context_lens=torch.zeros(0),
            cu_seqlens_q=torch.zeros(0), num_decodes=num_decodes, max_context_len=8, max_query_len=1,
            context_lens_list=[1] * num_seqs, query_lens_list=[1] * num_seqs)
        if cascade:
            m.prefix_len = torch.zeros(1)
        return m

    assert nano.applies(meta(16, 16), 16)
    assert not nano.applies(meta(15, 15), 15)  # too few rows
    assert not nano.applies(meta(16, 17), 24)  # a prefill chunk in the step
    assert not nano.applies(meta(16, 16, cascade=True), 16)
    assert not nano.applies(meta(16, 16), 16, lora=True)


@pytest.fixture(scope="module")
def reference():
    llm = LLM(max_model_len=256)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_engine_with_nano_batches_gives_the_same_greedy_outputs(reference):
    llm = LLM(max_model_len=256, nano_batch_min_decodes=16)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert llm.engine.runner.nano_forward.steps >= 20  # every decode step of >= 16 rows ran split


class _Recorder:
    """Stands for CudaStreamOps: logs every fork, join, event record and wait with the stream it is issued on."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.current = "main"
        self.events = 0

    def main(self):
        return "main"

    def side(self):
        return "side"

    def on(self, stream):
        import contextlib

        recorder = self

        @contextlib.contextmanager
        def ctx():
            before, recorder.current = recorder.current, stream
            yield
            recorder.current = before

        return ctx()

    def wait_stream(self, waiter, other):
        self.log.append(("wait_stream", waiter, other))

    def new_event(self):
        self.events += 1
        return self.events

    def record(self, event):
        self.log.append(("record", self.current, event))

    def wait_event(self, event):
        self.log.append(("wait_event", self.current, event))


def test_stream_order_fork_turns_join(reference):
    """What the CUDA path issues, recorded on the CPU: fork, per layer A's then B's attention each waiting for the
    other stream's previous one (recorded before the wait is issued), join; and the outputs stay right."""
    llm = LLM(max_model_len=256, nano_batch_min_decodes=16)
    nano = llm.engine.runner.nano_forward
    nano.ops = recorder = _Recorder()
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    layers = len(llm.engine.runner.model.model.layers)
    per_forward = 2 + 2 * layers + (2 * layers - 1)  # fork, join, records, waits
    assert len(recorder.log) == nano.steps * per_forward and nano.steps >= 20
    for step in range(nano.steps):
        log = recorder.log[step * per_forward : (step + 1) * per_forward]
        assert log[0] == ("wait_stream", "side", "main") and log[-1] == ("wait_stream", "main", "side")
        recorded: dict[int, str] = {}
        records = [entry for entry in log if entry[0] == "record"]
        assert [stream for _, stream, _ in records] == ["main", "side"] * layers  # attention takes turns
        for kind, stream, event in log[1:-1]:
            if kind == "record":
                recorded[event] = stream
            else:  # a wait names an event already recorded, on the other stream
                assert kind == "wait_event" and event in recorded and recorded[event] != stream


def test_nano_batches_with_speculative_decode_rows(reference):
    """Speculative verifies reach the decode path as k + 1 one-query decode rows: split anywhere, the same."""
    llm = LLM(max_model_len=256, nano_batch_min_decodes=16, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "policy": "always"})
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert llm.engine.stats.spec.num_accepted_tokens_total > 0
    assert llm.engine.runner.nano_forward.steps > 0


@pytest.mark.gpu
@pytest.mark.parametrize("async_scheduling, enforce_eager", [(False, False), (True, False), (False, True)])
def test_nano_batch_cuda_graphs_give_the_same_greedy_outputs(small_model_dir, async_scheduling, enforce_eager):
    """CUDA: decode graphs of >= 16 rows captured as two streams, and eager steps on two streams (fp32 dummy
    weights: split and whole step agree far below an argmax gap); the steps ran them."""
    import gc

    common = {"load_format": "dummy", "dtype": "float32", "max_model_len": 1024, "max_num_seqs": 48,
              "async_scheduling": async_scheduling, "gpu_memory_utilization": 0.2, "enforce_eager": enforce_eager}
    rng = random.Random(2)
    prompts = [{"prompt_token_ids": [rng.randint(3, 1000) for _ in range(rng.randint(5, 300))]} for _ in range(40)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    off = LLM(str(small_model_dir), **common)
    expected = [o.outputs[0].token_ids for o in off.generate(prompts, params, use_tqdm=False)]
    del off
    gc.collect()
    torch.cuda.empty_cache()
    on = LLM(str(small_model_dir), **common, nano_batch_min_decodes=16)
    got = [o.outputs[0].token_ids for o in on.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    runner = on.engine.runner
    if enforce_eager:
        assert runner.graph_runner is None and runner.nano_forward.steps > 20
    else:
        assert runner.graph_runner.nano_keys and runner.nano_batch_graph_steps > 0
