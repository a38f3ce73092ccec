"""Session affinity as configured (the Ingress's upstream-hash-by, compose's nginx directive, the measured
runs' nginx config, which nginx itself checks when installed) and the case's summary figures on hand-made
turns with known answers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from case_coding_agent.loadtest.run_case import kv_pool_tokens
from case_coding_agent.loadtest.summary import (
    affinity,
    hit_rate,
    peak_kv_need,
    recompute,
    summarize,
    token_latency,
    warm_ttft_during_cold,
)
from case_coding_agent.router import nginx_conf

CASE = Path(__file__).resolve().parents[2] / "case_coding_agent"


def test_the_ingress_hashes_the_session_header_onto_the_engine_service():
    ingress = yaml.safe_load((CASE / "k8s/base/ingress-engine.yaml").read_text())
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_session_id"
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # SSE streams unbuffered
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    service = yaml.safe_load((CASE / "k8s/base/service-engine.yaml").read_text())
    assert backend == {"name": service["metadata"]["name"], "port": {"name": service["spec"]["ports"][0]["name"]}}


def test_compose_nginx_hashes_the_session_header_over_both_replicas():
    compose = yaml.safe_load((CASE / "docker-compose.yaml").read_text())
    conf = compose["configs"]["nginx-config"]["content"]
    assert "hash $$http_x_session_id consistent;" in conf  # $$: compose's escape for a literal $
    assert "server 127.0.0.1:${ENGINE_PORT:-8001};" in conf and "server 127.0.0.1:${ENGINE_B_PORT:-8002};" in conf
    assert {"engine", "engine-b", "router", "prometheus"} <= set(compose["services"])


@pytest.mark.parametrize("policy", ["session_hash", "round_robin"])
def test_nginx_accepts_the_measured_runs_config(policy, tmp_path):
    conf = nginx_conf(["127.0.0.1:9001", "127.0.0.1:9002"], 9000, policy, str(tmp_path))
    assert ("hash $http_x_session_id consistent;" in conf) == (policy == "session_hash")
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        if os.environ.get("SHARED_ENGINE_REQUIRE_NGINX") == "1":  # scripts/ci/setup_nginx.sh ran (or failed)
            pytest.fail("SHARED_ENGINE_REQUIRE_NGINX=1 but nginx is not installed")
        pytest.skip("nginx not installed (apt-get install nginx-light)")
    (tmp_path / "nginx.conf").write_text(conf)
    out = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="round_robin"):
        nginx_conf(["a:1"], 1, "random")


def turn(session, n, prompt, cached, start, first, kind="read", chunks=(), replica="a", output=0):
    return {"session_id": session, "turn": n, "kind": kind, "prompt_tokens": prompt, "cached_tokens": cached,
            "start_s": start, "first_token_s": first, "ttft_s": first - start, "chunk_times_s": list(chunks),
            "output_tokens": output, "tpot_s": None if output < 2 else (chunks[-1] - first) / (output - 1),
            "replica": replica, "error": None}


def test_hit_rate_counts_turns_two_and_later_against_the_previous_prompt_in_whole_blocks():
    turns = [turn("s", 1, 100, 0, 0, 1), turn("s", 2, 150, 96, 2, 3), turn("s", 3, 200, 48, 4, 5)]
    h = hit_rate(turns, 16)
    assert h["turns2plus_prompt_tokens"] == 350 and h["turns2plus_cached_tokens"] == 144
    assert h["turns2plus_hit_rate"] == round(144 / 350, 4)
    assert h["turns2plus_hit_rate_ceiling"] == round((96 + 144) / 350, 4)  # 100 -> 96, 150 -> 144


def test_warm_ttft_counts_only_warm_turns_that_waited_during_the_cold_prefill():
    turns = [turn("cold0", 1, 1600, 0, 10, 30, kind="cold"),
             turn("s", 2, 300, 200, 12, 20),    # waited inside the cold window: 8 s
             turn("s", 3, 300, 200, 31, 32),    # after it
             turn("s", 1, 200, 0, 11, 15),      # a first turn is not warm
             turn("t", 2, 300, 200, 5, 11)]     # overlaps its start: 6 s
    w = warm_ttft_during_cold(turns)
    assert w["num_warm_turns"] == 3 and w["num_warm_turns_during_cold_prefill"] == 2
    assert w["max_warm_ttft_during_cold_ms"] == 8000.0 and w["cold_ttft_ms"] == [20000.0]


def test_token_latency_and_affinity():
    turns = [turn("s", 1, 10, 0, 0, 1, kind="edit", chunks=(1, 1.5, 2.5), output=5, replica="a"),
             turn("s", 2, 10, 0, 3, 4, chunks=(4, 4.5), output=2, replica="b"),
             turn("t", 1, 10, 0, 0, 1, replica="b")]
    lat = token_latency(turns)
    assert lat["edit_median_itl_ms"] == 750.0 and lat["edit_median_tpot_ms"] == 375.0  # 1.5 s / 4 tokens
    assert lat["all_median_itl_ms"] == 500.0
    a = affinity(turns)
    assert a["sessions_on_one_replica"] == 1 and a["replicas_per_session"] == {"s": ["a", "b"], "t": ["b"]}


def test_recompute_counts_reusable_tokens_the_cache_did_not_serve():
    turns = [turn("s", 1, 100, 0, 0, 1), turn("s", 2, 150, 96, 2, 3),  # everything reusable served
             turn("s", 3, 200, 48, 4, 5),                               # 144 reusable, 48 served: 96 recomputed
             turn("t", 1, 40, 0, 0, 1), turn("t", 2, 60, 32, 2, 3)]     # 32 reusable, 32 served
    r = recompute(turns, 16)
    assert r["recomputed_reusable_tokens"] == 96
    assert r["recomputed_share_of_prompt_tokens"] == round(96 / 550, 4)  # over every turn's prompt tokens
    more = [*turns[:2], turn("s", 3, 200, 160, 4, 5)]  # served more than the previous prompt: never negative
    assert recompute(more, 16)["recomputed_reusable_tokens"] == 0


def test_peak_kv_need_sums_the_live_sessions_latest_turns():
    def live(session, n, prompt, start, end, output):
        t = turn(session, n, prompt, 0, start, start + 1)
        t["output_tokens"], t["end_s"] = output, end
        return t

    a1, a2 = live("a", 1, 100, 0, 2, 10), live("a", 2, 300, 5, 7, 20)
    b1, b2 = live("b", 1, 50, 2, 4, 5), live("b", 2, 80, 8, 10, 5)
    # at 5 s: a holds its turn 2 (320), b its turn 1 (55); at 8 s a has ended, b holds 85
    assert peak_kv_need([a1, a2, b1, b2])["peak_kv_need_tokens"] == 375
    c1 = live("c", 1, 1000, 20, 22, 1)  # starts after both ended: alone
    assert peak_kv_need([a1, a2, b1, b2, c1])["peak_kv_need_tokens"] == 1001
    s = summarize([a1, a2, b1, b2, c1], 16)
    assert s["peak_kv_need_tokens"] == 1001 and "recomputed_share_of_prompt_tokens" in s


def test_the_pool_size_is_read_from_the_servers_start_up_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO ... shared_engine: KV cache size: 444,848 tokens, maximum concurrency for 131,072 tokens "
                   "per request: 3.39x\n")
    assert kv_pool_tokens(log) == 444848
    log.write_text("no such line\n")
    assert kv_pool_tokens(log) is None
    assert kv_pool_tokens(tmp_path / "missing.log") is None
    real = Path(__file__).parents[2] / "benchmarks/results/coding_agent_first_attempt_h100_cae0e36_cut.server0.log"
    assert kv_pool_tokens(real) == 444848  # the engine's own wording, from a GPU run
