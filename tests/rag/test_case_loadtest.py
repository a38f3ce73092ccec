"""The case benchmark (`case_rag_chatbot/loadtest/run_case.py`): prompt order read from the app's builder,
token-id prompts, hit-rate arithmetic, metrics parsing, and one short closed-loop run against a real server
that writes a complete results file. That run uses a shape preset with dummy weights, as the H200 run does
(`llama-3.1-8b`), so the stand-in tokenizer that makes such a server stream per token is exercised too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LOADTEST = REPO / "case_rag_chatbot" / "loadtest"
sys.path.insert(0, str(LOADTEST))

from case_workload import RequestSampler, load_profile, load_variant  # noqa: E402
from engine_client import RequestRecord, iteration_histogram, merge_metrics, parse_metrics  # noqa: E402
from prompt_builder import build_messages, segment_order  # noqa: E402
from summary import engine_summary, system_prompt_hits  # noqa: E402


@pytest.mark.parametrize("builder", [None, build_messages], ids=["app", "local"])
def test_segment_order_follows_the_builder(builder):
    assert segment_order(False, builder) == ("system", "context", "question")
    assert segment_order(True, builder) == ("context", "system", "question")


def test_variants_name_their_order_and_config():
    fix, first = load_variant("the_fix", "h200"), load_variant("first_attempt", "cpu")
    assert fix["context_first"] is False and first["context_first"] is True
    assert fix["config"].exists() and first["config"].exists()
    settings = yaml.safe_load(fix["config"].read_text())
    assert settings["max_num_batched_tokens"] < yaml.safe_load(first["config"].read_text())["max_num_batched_tokens"]


@pytest.mark.parametrize("order", [("system", "context", "question"), ("context", "system", "question")])
def test_sampler_lays_out_segments(order):
    profile = load_profile("cpu")
    sampler = RequestSampler(profile, 49152, order, seed=0)
    rng = np.random.default_rng(1)
    kinds = set()
    for _ in range(50):
        r = sampler.sample(rng)
        kinds.add(r.kind)
        assert r.prompt[r.system_offset:r.system_offset + r.system_tokens] == sampler.system
        assert (r.system_offset == 0) == (order[0] == "system")
        assert len(r.prompt) + r.max_tokens <= sampler.max_request_tokens()
        assert profile.answer_tokens.min <= r.max_tokens <= profile.answer_tokens.max
    assert kinds == {"rag", "document"}


def test_system_hit_tokens_counts_full_blocks_only():
    rec = RequestRecord("rag", 0, 0.0, 100, 4, system_offset=0, system_tokens=40, ttft_s=1.0)
    rec.cached_tokens = 32
    assert rec.system_hit_tokens(16) == (32, 32)  # 40 tokens: 2 full blocks are cacheable
    rec.cached_tokens = 80  # the hit ran on into the context
    assert rec.system_hit_tokens(16) == (32, 32)
    late = RequestRecord("rag", 0, 0.0, 100, 4, system_offset=20, system_tokens=40)
    late.cached_tokens = 0
    assert late.system_hit_tokens(16) == (0, 28)  # blocks end at 48: positions 20..47
    late.ttft_s = 1.0
    assert system_prompt_hits([rec, late], 16)["system_prompt_hit_rate"] == pytest.approx(32 / 60)


METRICS = """# HELP vllm:num_requests_waiting x
vllm:num_requests_waiting{model_name="m"} 3.0
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
vllm:prefix_cache_hits_total{model_name="m"} 900.0
vllm:prompt_tokens_total{model_name="m"} 100.0
vllm:iteration_tokens_total_bucket{le="1.0",model_name="m"} 4.0
vllm:iteration_tokens_total_bucket{le="64.0",model_name="m"} 6.0
vllm:iteration_tokens_total_bucket{le="+Inf",model_name="m"} 7.0
"""


def test_metrics_parsing_and_window_deltas():
    end = parse_metrics(METRICS)
    assert end["vllm:num_requests_waiting"] == 3.0
    assert iteration_histogram(end) == {"1.0": 4.0, "64.0": 6.0, "+Inf": 7.0}
    start = {"vllm:prefix_cache_queries_total": 500.0, "vllm:prefix_cache_hits_total": 400.0}
    series = {"t_s": [0.0, 1.0], "vllm:num_requests_running": [1, 2], "vllm:num_requests_waiting": [0, 3],
              "vllm:kv_cache_usage_perc": [0.1, 0.5]}
    e = engine_summary(start, end, series, (0.0, 1.0), num_requests=10)
    assert e["prefix_cache_hit_rate"] == pytest.approx((900 - 400) / (1000 - 500))
    assert e["steps_by_tokens_le"] == {"1.0": 4.0, "64.0": 2.0, "+Inf": 1.0} and e["num_steps"] == 7.0
    assert e["max_num_requests_waiting"] == 3 and e["prefill_tokens_computed_per_request"] == 10.0


def test_replicas_metrics_merge_as_one_deployment():
    a = {"vllm:prompt_tokens_total": 100.0, "vllm:num_requests_waiting": 2.0, "vllm:kv_cache_usage_perc": 0.7,
         'vllm:iteration_tokens_total_bucket{le="64.0"}': 5.0}
    b = {"vllm:prompt_tokens_total": 50.0, "vllm:num_requests_waiting": 1.0, "vllm:kv_cache_usage_perc": 0.2,
         'vllm:iteration_tokens_total_bucket{le="64.0"}': 3.0, "vllm:num_preemptions_total": 1.0}
    m = merge_metrics([a, b])
    assert m["vllm:prompt_tokens_total"] == 150.0 and m["vllm:num_requests_waiting"] == 3.0
    assert m["vllm:kv_cache_usage_perc"] == 0.7  # the fullest replica, not a sum over 100 %
    assert iteration_histogram(m) == {"64.0": 8.0} and m["vllm:num_preemptions_total"] == 1.0
    assert merge_metrics([a]) == a


@pytest.mark.slow
def test_run_case_writes_a_complete_results_file(tmp_path):
    workload = yaml.safe_load((REPO / "case_rag_chatbot" / "workload.yaml").read_text())
    workload["profiles"] = {"tiny": {
        "users": 2, "think_time_s": {"dist": "exponential", "mean": 0.3}, "system_prompt_tokens": 64,
        "context": {"chunks": 2, "chunk_tokens": 8, "corpus_chunks": 20}, "question_tokens": {"min": 4, "max": 8},
        "answer_tokens": {"min": 3, "max": 5}, "document_share": 0.2, "document_tokens": {"min": 16, "max": 32},
        "warmup_s": 3, "duration_s": 12,
        "engine": {"model": "smollm2-135m", "load_format": "dummy", "max_model_len": 256,
                   "num_gpu_blocks_override": 64},
        "targets": {"p95_ttft_ms": 60000, "p95_itl_ms": 60000, "min_system_prompt_hit_rate": 0.5}}}
    for variant in workload["variants"].values():
        variant["config"]["tiny"] = variant["config"]["cpu"]
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(workload))
    out = tmp_path / "results_tiny.json"
    cmd = [sys.executable, str(LOADTEST / "run_case.py"), "--workload", str(path), "--profile", "tiny",
           "--variant", "the_fix", "--drain-s", "30", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    for key in ("hardware", "commit", "command", "server_command", "engine_config", "config_yaml", "workload",
                "idle_reference", "timeseries", "requests", "engine_log_stats_lines"):
        assert key in r, key
    s = r["summary"]
    assert s["completed"] > 0 and s["failed"] == 0, s["errors"]
    assert r["prompt_order"] == ["system", "context", "question"]
    fix_cpu = yaml.safe_load((REPO / "case_rag_chatbot/the_fix/config_cpu.yaml").read_text())
    assert r["engine_config"]["max_num_batched_tokens"] == fix_cpu["max_num_batched_tokens"]  # config reached it
    assert s["system_prompt_hit_rate"] > 0.5 and s["targets_met"]["all"]
    for key in ("p50", "p95", "p99"):
        name = "median" if key == "p50" else key
        assert s[f"{name}_ttft_ms"] > 0 and f"{name}_itl_ms" in s
    assert len(s["ttft_quantiles_ms"]) == 101 and len(s["itl_quantiles_ms"]) == 101  # streamed per token
    assert r["model"]["root"] == "smollm2-135m" and "--tokenizer" in r["server_command"]
    assert s["engine"]["num_steps"] > 0 and s["engine"]["prefix_cache_hit_rate"] > 0


@pytest.mark.slow
def test_sweep_against_running_replicas(tmp_path):
    """`--base-url` with two running replicas (no server started) and `--sweep-users`: one window per user
    count, the highest that met the targets named; user u talks to replica u mod 2, and the engine figures
    count both replicas' work."""
    sys.path.insert(0, str(LOADTEST))
    from engine_server import EngineServer

    workload = yaml.safe_load((REPO / "case_rag_chatbot" / "workload.yaml").read_text())
    tiny = {"users": 1, "think_time_s": {"dist": "exponential", "mean": 0.2}, "system_prompt_tokens": 32,
            "context": {"chunks": 1, "chunk_tokens": 8, "corpus_chunks": 4}, "question_tokens": {"min": 2, "max": 4},
            "answer_tokens": {"min": 2, "max": 3}, "document_share": 0.0, "document_tokens": {"min": 8, "max": 8},
            "warmup_s": 1, "duration_s": 5, "engine": {},
            "targets": {"p95_ttft_ms": 60000, "p95_itl_ms": 60000, "min_system_prompt_hit_rate": 0.0}}
    workload["profiles"] = {"tiny": tiny}
    for variant in workload["variants"].values():
        variant["config"]["tiny"] = variant["config"]["cpu"]
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(workload))
    out = tmp_path / "sweep_tiny.json"
    settings = {"model": "smollm2-135m", "load_format": "dummy", "max_model_len": 128}
    with EngineServer(None, settings, [], tmp_path / "server0.log", wait=False) as first, \
            EngineServer(None, settings, [], tmp_path / "server1.log") as second:
        first.wait_healthy()
        cmd = [sys.executable, str(LOADTEST / "run_case.py"), "--workload", str(path), "--profile", "tiny",
               "--variant", "the_fix", "--base-url", f"{first.url},{second.url}", "--sweep-users", "1,2",
               "--out", str(out)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        served = [parse_metrics(httpx.get(s.url + "/metrics").text)["vllm:prompt_tokens_total"]
                  for s in (first, second)]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert [run["load"]["users"] for run in r["runs"]] == [1, 2] and r["server_command"].startswith("(running")
    assert r["replicas"] == 2 and r["highest_sustained"]["users"] in (1, 2)
    assert all(run["summary"]["completed"] > 0 for run in r["runs"])
    assert served[0] > 0 and served[1] > 0  # the second window's user 1 went to the second replica
    counted = sum(run["summary"]["engine"]["prefill_tokens_computed"] for run in r["runs"])
    assert counted > 0


def test_gpu_deployment_keeps_the_measured_replica_floor():
    """The Kubernetes GPU overlay never scales the engine below the replicas the fix was measured with."""
    from tests.deploy.test_k8s_manifests import overlay

    objs = overlay(REPO / "case_rag_chatbot" / "k8s", "gpu")
    scaled = objs[("ScaledObject", "engine")]["spec"]
    assert scaled["minReplicaCount"] == load_variant("the_fix", "h200")["replicas"] == 2
    assert scaled["maxReplicaCount"] > scaled["minReplicaCount"]
    assert load_variant("the_fix", "cpu")["replicas"] == load_variant("first_attempt", "h200")["replicas"] == 1


def test_replicas_need_a_gpu_each(tmp_path, monkeypatch):
    """The fix's H200 run starts two replicas, one per GPU: where there are fewer, it stops before starting
    any server, instead of putting a replica on the CPU; an explicit `CUDA_VISIBLE_DEVICES` list is honoured."""
    import run_case
    from engine_server import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert visible_gpus() == ["3"]
    with pytest.raises(SystemExit, match="2 replicas need 2 GPUs"):
        run_case.main(["--profile", "h200", "--variant", "the_fix", "--out", str(tmp_path / "r.json")])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert visible_gpus() == ["2", "5"]
    with pytest.raises(SystemExit, match="--replicas 3 but --base-url names 2"):
        run_case.main(["--profile", "h200", "--variant", "the_fix", "--replicas", "3",
                       "--base-url", "http://127.0.0.1:1,http://127.0.0.1:2", "--out", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()


def test_replicas_with_different_configs_are_refused(monkeypatch):
    import run_case

    configs = {"http://a": {"max_model_len": 4096, "block_size": 16, "tokenizer": "/tmp/x"},
               "http://b": {"max_model_len": 2048, "block_size": 16, "tokenizer": "/tmp/y"},
               "http://c": {"max_model_len": 4096, "block_size": 16, "tokenizer": "/tmp/z"}}

    class Reply:
        def __init__(self, url):
            self.url = url

        def json(self):
            return {"engine_config": configs[self.url.removesuffix("/version")]}

    monkeypatch.setattr(run_case.httpx, "get", lambda url, timeout: Reply(url))
    run_case.check_same_config(["http://a", "http://c"])  # only the tokenizer path differs
    with pytest.raises(SystemExit, match=r"http://b runs another engine config .*\['max_model_len'\]"):
        run_case.check_same_config(["http://a", "http://b"])
