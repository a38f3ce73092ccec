"""`scripts/bench_offline.py`'s results file: when transformers runs the first K of N requests, our engine runs
those same K requests too and `speedup_vs_transformers` divides ours on the K by transformers on the K (never ours
on all N); each side records the batch it actually ran at (ours: sequences per step; `generate_batch`: requests
per step and the continuous-batching config it resolved, not `--hf-batch-size`). The default model on the CPU,
a tiny workload."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = ["--input-len-min", "8", "--input-len-max", "16", "--output-len-min", "3", "--output-len-max", "6"]


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_offline", REPO / "scripts/bench_offline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_bench(tmp_path, *extra) -> dict:
    out = tmp_path / "offline.json"
    cmd = [sys.executable, "scripts/bench_offline.py", "--device", "cpu", *WORKLOAD, *extra, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def output_lengths(num_requests: int) -> list[int]:
    args = Namespace(seed=0, num_requests=num_requests, input_len_min=8, input_len_max=16, output_len_min=3,
                     output_len_max=6)
    return bench_module().workload(args)[1]


def test_generate_batch_subset_is_compared_like_for_like(tmp_path):
    n, k = 4, 2
    r = run_bench(tmp_path, "--num-requests", str(n), "--hf-mode", "generate_batch", "--hf-num-requests", str(k),
                  "--hf-num-blocks", "8", "--hf-max-batch-tokens", "256")
    lens = output_lengths(n)
    ours, sub, hf = r["ours"], r["ours_subset"], r["transformers"]
    assert "error" not in hf, hf
    # ours on the whole workload, clearly labelled, and ours on exactly transformers' K requests
    assert ours["num_requests"] == n and ours["output_tokens"] == sum(lens) and "whole workload" in ours["requests"]
    assert sub["num_requests"] == hf["num_requests"] == k
    assert sub["output_tokens"] == hf["output_tokens"] == sum(lens[:k])
    assert sub["prefix_cache_hits"] == 0  # the subset did not find the whole run's prompts cached
    assert hf["generated_tokens"] == k * max(lens[:k])  # one max_new_tokens for all: the longest's length each
    # the speed-up is the subset's, like for like
    assert r["speedup_vs_transformers"] == pytest.approx(sub["output_throughput"] / hf["output_throughput"])
    assert r["speedup_vs_transformers"] != pytest.approx(ours["output_throughput"] / hf["output_throughput"])
    assert r["speedup_basis"] == {"requests": hf["requests"], "num_requests": k, "ours": "ours_subset",
                                  "transformers": "transformers", "like_for_like": True}
    # the batch each actually ran at
    for run, size in ((ours, n), (sub, k)):
        batch = run["running_batch"]
        assert 1 <= batch["max_seqs_per_step"] <= size and batch["max_decode_seqs"] <= size
        assert 1 <= batch["mean_seqs_per_step"] <= batch["max_seqs_per_step"]
        assert 1 <= batch["mean_decode_seqs"] <= batch["max_decode_seqs"] and batch["decode_steps"] >= 1
        assert batch["max_num_seqs"] == ours["engine_config"]["max_num_seqs"]
    assert sub["running_batch"]["max_seqs_per_step"] == k  # both subset requests fit one step's budget
    assert "batch_size" not in hf
    batch = hf["running_batch"]
    assert batch["max_requests_per_step"] == k and batch["steps"] >= max(lens[:k])
    assert 1 <= batch["mean_requests_per_step"] <= k and 1 <= batch["max_decode_requests"] <= k
    config = batch["continuous_batching_config"]
    assert config["num_blocks"] == 8 and config["max_batch_tokens"] == 256  # what it ran with, resolved
    assert config["max_requests_per_batch"] >= 1 and config["page_size"] >= 1
    assert 0 <= hf["warmup_s"] <= hf["elapsed_including_warmup_s"]
    assert hf["elapsed_s"] == pytest.approx(hf["elapsed_including_warmup_s"] - hf["warmup_s"])


def test_generate_on_the_whole_workload_needs_no_subset(tmp_path):
    n = 3
    r = run_bench(tmp_path, "--num-requests", str(n), "--hf-mode", "generate", "--hf-batch-size", "2")
    lens = output_lengths(n)
    ours, hf = r["ours"], r["transformers"]
    assert "ours_subset" not in r and hf["num_requests"] == ours["num_requests"] == n
    assert r["speedup_basis"]["ours"] == "ours"
    assert r["speedup_vs_transformers"] == pytest.approx(ours["output_throughput"] / hf["output_throughput"])
    # padded batches of 2 then 1, every row decoding to its batch's longest request
    batch = hf["running_batch"]
    assert batch == {"padded_batch_size": 2, "batches": 2, "max_rows_per_step": 2,
                     "mean_rows_per_step": pytest.approx((2 * max(lens[:2]) + lens[2]) / (max(lens[:2]) + lens[2]))}
    assert hf["generated_tokens"] == 2 * max(lens[:2]) + lens[2] and hf["output_tokens"] == sum(lens)
