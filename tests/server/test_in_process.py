"""The app in-process on a tiny dummy-weight model (token-id prompts): engine failure (500 + unhealthy),
overload (503 + Retry-After), API key (401), body limit (413), metrics names and /openapi.json."""

from __future__ import annotations

import asyncio
import time

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app

PROMPT = [5, 6, 7, 8]


def _engine(tiny_model_dir, **settings) -> LLMEngine:
    return LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                            num_gpu_blocks_override=64, **settings))


def test_engine_failure_fails_requests_and_health(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    app = create_app(engine)

    def broken(*_args, **_kwargs):
        raise RuntimeError("injected device fault")

    async def scenario(client):
        assert (await client.get("/health")).status_code == 200
        engine.runner.execute = broken
        r = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
        health = await client.get("/health")
        assert health.status_code == 503 and "error" in health.json()
        again = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert again.status_code == 503

    run_app(app, scenario)


def test_overload_is_503_with_retry_after(tiny_model_dir):
    from shared_engine.sampling_params import SamplingParams

    engine = _engine(tiny_model_dir, max_num_seqs=1, max_waiting_requests=1)
    step = engine.step

    def slow_step():  # a slow device: the first request runs while the next one waits
        time.sleep(0.01)
        return step()

    engine.step = slow_step
    app = create_app(engine)
    async_engine = app.state.ctx.async_engine

    async def scenario(client):
        params = SamplingParams(max_tokens=100, ignore_eos=True)
        async_engine.add_request("running", PROMPT, params)
        for _ in range(300):
            if engine.scheduler.num_running == 1:
                break
            await asyncio.sleep(0.01)
        async_engine.add_request("waiting", PROMPT, params)
        await asyncio.sleep(0.05)
        assert async_engine.num_waiting == 1
        r = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] and r.json()["error"]["code"] == 503
        for rid in ("running", "waiting"):
            async_engine.abort(rid)
        for _ in range(300):  # the engine thread applies aborts before its next step
            if async_engine.num_waiting == 0 and engine.scheduler.num_running == 0:
                break
            await asyncio.sleep(0.01)
        ok = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        assert ok.status_code == 200

    run_app(app, scenario)


def test_api_key_and_body_limit(tiny_model_dir):
    app = create_app(_engine(tiny_model_dir), ServerConfig(api_key="sekret", max_request_body_bytes=1000))

    async def scenario(client):
        assert (await client.get("/v1/models")).status_code == 401
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
        auth = {"Authorization": "Bearer sekret"}
        assert (await client.get("/v1/models", headers=auth)).status_code == 200
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        big = await client.post("/v1/completions", headers=auth, json={"prompt": list(range(1, 600))})
        assert big.status_code == 413 and big.json()["error"]["code"] == 413

    run_app(app, scenario)


def test_metrics_names_and_labels(tiny_model_dir):
    app = create_app(_engine(tiny_model_dir, served_model_name="tiny"))

    async def scenario(client):
        r = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "model": "tiny"})
        assert r.status_code == 200 and r.json()["model"] == "tiny"
        return (await client.get("/metrics")).text

    text = run_app(app, scenario)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                 "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total"):
        assert f'{name}{{model_name="tiny"}}' in text, name
    for direction in ("GPU_to_CPU", "CPU_to_GPU"):  # KV offload off: 0 blocks either way
        assert f'vllm:kv_offload_blocks_total{{model_name="tiny",transfer_type="{direction}"}} 0.0' in text
    assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
    assert 'vllm:generation_tokens_total{model_name="tiny"} 3.0' in text
    assert 'vllm:time_to_first_token_seconds_bucket{le="2560.0",model_name="tiny"} 1.0' in text
    assert 'vllm:inter_token_latency_seconds_bucket{le="0.01",model_name="tiny"}' in text
    assert 'vllm:e2e_request_latency_seconds_bucket{le="7680.0",model_name="tiny"}' in text
    assert 'vllm:iteration_tokens_total_bucket{le="16384.0",model_name="tiny"}' in text
    for name in ("request_time_per_output_token_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds"):
        assert f"# TYPE vllm:{name} histogram" in text


def test_openapi_documents_routes_and_errors(tiny_model_dir):
    app = create_app(_engine(tiny_model_dir))
    schema = app.openapi()
    paths = schema["paths"]
    for path, method in (("/v1/completions", "post"), ("/v1/chat/completions", "post"), ("/v1/models", "get"),
                         ("/health", "get"), ("/metrics", "get"), ("/tokenize", "post"),
                         ("/detokenize", "post"), ("/version", "get")):
        assert method in paths[path], path
    completions = paths["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "500", "503"} <= set(completions) and "422" not in completions
    assert "itemSchema" in completions["200"]["content"]["text/event-stream"]
    assert "HTTPValidationError" not in schema["components"]["schemas"]


@pytest.mark.parametrize("body", [{"prompt": [[1, 2], [3, 4]], "max_tokens": 2, "n": 2}])
def test_multiple_prompts_and_n(tiny_model_dir, body):
    app = create_app(_engine(tiny_model_dir))

    async def scenario(client):
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
        assert sorted(c["index"] for c in data["choices"]) == [0, 1, 2, 3]
        assert data["usage"]["prompt_tokens"] == 4 and data["usage"]["completion_tokens"] == 8

    run_app(app, scenario)
