"""scripts/profile_lora_step.py's helpers, without a GPU: why a step runs eagerly (the graph runner's bucket
checks), the busy time of overlapping kernel intervals, the LoRA kernels' names, and the host-time probe
over a real CPU engine's steps (every step recorded, the wraps undone after)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from scripts.lora_step_probe import StepProbe, graph_miss_reason
from scripts.profile_lora_step import interval_union, is_lora_kernel, kernel_summary
from shared_engine.model_executor.cuda_graph_runner import CudaGraphRunner, budget_filling_sizes, mixed_buckets
from tests.engine.test_graph_buckets import _meta


def _runner() -> CudaGraphRunner:
    runner = object.__new__(CudaGraphRunner)
    decode, prefill = mixed_buckets(256, 2048)
    runner.decode_sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    runner.mixed_decode_sizes, runner.mixed_prefill_sizes = decode, prefill
    runner.extra_mixed_sizes = budget_filling_sizes(decode, 8192, 2048)
    runner.max_prefill_seqs = 8
    runner.block_tables = torch.zeros(1, 64, dtype=torch.int32)
    return runner


def test_graph_miss_reasons_follow_the_bucket_checks():
    runner = _runner()
    for decodes, chunks, reason in [
        (0, [256] * 32, "prefill sequences > 8"),  # the bench's 8,192-token prefill steps
        (200, [4000], "prefill tokens > 2048"),
        (300, [], "300 decodes > the largest decode graph 256"),
    ]:
        meta, tokens = _meta(decodes, chunks)
        assert runner._bucket(meta, tokens) is None
        assert graph_miss_reason(runner, meta, tokens).startswith(reason)
    assert graph_miss_reason(None, *_meta(4, [])) == "eager mode (no graph runner)"


def test_interval_union_counts_overlaps_once():
    assert interval_union([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert interval_union([]) == 0


def test_kernel_summary_shares_and_idle_time():
    def event(name, start, end):
        return SimpleNamespace(name=name, device_type=SimpleNamespace(name="CUDA"), device_time=end - start,
                               time_range=SimpleNamespace(start=start, end=end))

    events = [event("gemm_bf16", 0, 600), event("_sgmv_shrink_kernel", 600, 700),
              event("_sgmv_expand_kernel", 1000, 1300), event("gemm_bf16", 1300, 2000)]
    summary = kernel_summary(events, 2, "cuda")
    assert summary["total_ms"] == 1.7 and summary["lora_ms"] == 0.4 and summary["lora_launches_per_step"] == 1.0
    assert summary["span_ms"] == 2.0 and summary["busy_ms"] == 1.7 and summary["idle_share"] == 0.15
    assert summary["top"][0] == {"name": "gemm_bf16", "ms": 1.3, "ms_per_step": 0.65, "count": 2,
                                 "share": round(1.3 / 1.7, 4), "lora": False}
    assert is_lora_kernel("_expand_kernel") and not is_lora_kernel("paged_decode_attention_kernel")


def test_probe_records_every_step_and_unwraps():
    from shared_engine import LLM, SamplingParams

    llm = LLM("smollm2-135m", load_format="dummy", max_model_len=64, max_num_seqs=4, num_gpu_blocks_override=64)
    engine = llm.engine
    probe = StepProbe(engine, lambda: None, torch.profiler.ProfilerActivity.CPU, decode_skip=1, decode_window=1)
    try:
        llm.generate([[5, 6, 7, 8]] * 2, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    finally:
        probe.close()
    assert len(probe.records) == len(probe.launched) == 4  # one prefill step, then 3 decode steps
    assert [e["prefill_seqs"] for e in probe.launched] == [2, 0, 0, 0]
    assert all(e["eager_reason"] == "eager mode (no graph runner)" for e in probe.launched)  # the CPU: no graphs
    assert [e["window"] for e in probe.launched] == [None, None, "decode", None]
    host = probe.records[1]["host"]
    assert host["launch"] >= host["build_inputs"] + host["eager_forward"] and host["launch_rest"] >= 0
    assert "schedule" not in engine.scheduler.__dict__ and "step" not in engine.__dict__  # wraps undone
    assert "decode" in probe.windows and len(probe.windows["decode"]["steps"]) == 1
