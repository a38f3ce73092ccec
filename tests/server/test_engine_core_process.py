"""The engine core in its own process (`EngineCoreClient`, the `serve` default) behind the app, on the tiny
dummy-weight model: same greedy tokens as the in-thread engine, streaming, aborts, rejected requests,
metrics, a core that dies mid-request (in-flight requests fail, /health 503), a core that cannot start;
and the output delta encoding the two processes speak, round-tripped against the cumulative outputs."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.engine.output_delta import OutputDeltaDecoder, OutputDeltaEncoder
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.engine_core_client import EngineCoreClient, EngineCoreStartError
from shared_engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from shared_engine.sampling_params import SamplingParams
from tests.server.app_runner import run_app

PROMPT = [5, 6, 7, 8, 9]


def _config(tiny_model_dir, **settings) -> EngineConfig:
    return EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                  num_gpu_blocks_override=64, **settings)


async def _stream_tokens(client, body) -> tuple[list[str], list[int]]:
    """The SSE events' choice texts and the final usage's completion token count."""
    texts, completion_tokens = [], []
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                             "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            texts += [c["text"] for c in event["choices"]]
            if event.get("usage"):
                completion_tokens.append(event["usage"]["completion_tokens"])
    return texts, completion_tokens


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> RequestOutput:
    """Greedy tokens with logprobs from the engine run in this process (dummy weights from seed 0)."""
    engine = LLMEngine(_config(tiny_model_dir))
    engine.add_request("ref", PROMPT, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2),
                       final_only=True)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs[-1]


def test_process_engine_matches_in_thread_engine(tiny_model_dir, reference):
    client = EngineCoreClient(_config(tiny_model_dir))
    assert client.pid != os.getpid()
    app = create_app(client)

    async def scenario(http):
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
        outputs = [o async for o in client.generate("g", PROMPT, params)]
        assert len(outputs) == 12 and [len(o.outputs[0].token_ids) for o in outputs] == list(range(1, 13))
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 12
        texts, usage = await _stream_tokens(http, body)
        assert usage == [12]
        n2 = await http.post("/v1/completions", json={**body, "n": 2, "temperature": 1.0, "seed": 3})
        assert [c["finish_reason"] for c in n2.json()["choices"]] == ["length", "length"]
        assert n2.json()["usage"]["completion_tokens"] == 24
        metrics = (await http.get("/metrics")).text
        generated = [line for line in metrics.splitlines() if line.startswith("vllm:generation_tokens_total")]
        assert float(generated[0].split()[-1]) == 12 * 5
        iterations = [line for line in metrics.splitlines()
                      if line.startswith("vllm:iteration_tokens_total_count")]
        assert float(iterations[0].split()[-1]) > 0
        return outputs[-1]

    final = run_app(app, scenario)
    got, want = final.outputs[0], reference.outputs[0]
    assert got.token_ids == want.token_ids
    assert [sorted(e) for e in got.logprobs] == [sorted(e) for e in want.logprobs]
    assert got.cumulative_logprob == pytest.approx(want.cumulative_logprob, rel=1e-5)
    assert final.prompt_token_ids == PROMPT and final.finished


def test_process_engine_rejects_and_keeps_serving(tiny_model_dir):
    app = create_app(EngineCoreClient(_config(tiny_model_dir, max_model_len=64)))

    async def scenario(http):
        too_long = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 100})
        assert too_long.status_code == 400 and too_long.json()["error"]["type"] == "invalid_request_error"
        bad_token = await http.post("/v1/completions", json={"prompt": [5, 999], "max_tokens": 2})
        assert bad_token.status_code == 400
        # abort mid-stream (the client goes away after the first event), then the engine still serves
        async with http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 50,
                               "ignore_eos": True, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break
        ok = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        for _ in range(50):  # the abort reaches the core; its stats follow
            running = [line for line in (await http.get("/metrics")).text.splitlines()
                       if line.startswith("vllm:num_requests_running")]
            if float(running[0].split()[-1]) == 0:
                break
            await asyncio.sleep(0.1)
        assert float(running[0].split()[-1]) == 0

    run_app(app, scenario)


def test_core_death_fails_in_flight_requests_and_health(tiny_model_dir):
    client = EngineCoreClient(_config(tiny_model_dir))
    app = create_app(client)

    async def scenario(http):
        assert (await http.get("/health")).status_code == 200
        async def consume():
            events, error = 0, None
            async with http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 400,
                                   "ignore_eos": True, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events += 1
                        if '"error"' in line:
                            error = json.loads(line[6:])["error"]
            return events, error

        task = asyncio.create_task(consume())
        while not client._streams:  # the request is on its way to the core: kill the core now
            await asyncio.sleep(0.001)
        os.kill(client.pid, signal.SIGKILL)
        events, error = await task
        assert error is not None and "engine" in error["message"] and error["code"] == 503, error
        assert events < 400  # the stream ended with the error, not after all its tokens
        for _ in range(50):
            if (await http.get("/health")).status_code == 503:
                break
            await asyncio.sleep(0.1)
        assert (await http.get("/health")).status_code == 503
        again = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert again.status_code == 503

    run_app(app, scenario)


def test_core_that_cannot_start_raises(tmp_path):
    with pytest.raises(EngineCoreStartError, match="config.json|not a model|No such|exist"):
        EngineCoreClient(EngineConfig.from_flat(model=str(tmp_path / "missing"), device="cpu"))


def _output(rid, texts, tokens, finished=False, lps=None, prompt_lps=None, reasons=None):
    outs = [CompletionOutput(index=i, text=t, token_ids=list(ids), logprobs=None if lps is None else lps[i],
                             finish_reason=(reasons or [None] * len(texts))[i], stream_safe_len=len(t) - 1)
            for i, (t, ids) in enumerate(zip(texts, tokens))]
    return RequestOutput(rid, "p", [1, 2, 3], outs, finished, RequestMetrics(arrival_time=1.0),
                         num_cached_tokens=2, prompt_logprobs=prompt_lps)


def test_output_deltas_round_trip_growing_and_shrinking_text():
    lp = [{7: Logprob(-0.5, 1)}, {8: Logprob(-0.1, 1)}, {9: Logprob(-0.2, 1)}]
    sequence = [
        _output("a", ["He", ""], [[7], []], lps=[lp[:1], []], prompt_lps=[None, {2: Logprob(-1.0)}, None]),
        _output("a", ["Hello", "x"], [[7, 8], [9]], lps=[lp[:2], lp[2:]],
                prompt_lps=[None, {2: Logprob(-1.0)}, None]),
        # a stop string trimmed at the end: the text shrinks, both choices finish
        _output("a", ["Hel", "xy"], [[7, 8, 9], [9, 9]], finished=True, lps=[lp, lp[2:] * 2],
                prompt_lps=[None, {2: Logprob(-1.0)}, None], reasons=["stop", "length"]),
    ]
    encoder, decoder = OutputDeltaEncoder(), OutputDeltaDecoder()
    decoder.register("a", "p", [1, 2, 3])
    previous = None
    for original in sequence:
        delta = encoder.encode(original)
        rebuilt = decoder.decode(delta)
        assert rebuilt == original
        assert previous is None or rebuilt.outputs[0] is not previous.outputs[0]  # new objects every time
        previous = rebuilt
    assert "a" not in decoder  # finished: forgotten on both sides
    assert encoder._sent == {}
    # a delta carries only the new tokens, never the prompt
    encoder2 = OutputDeltaEncoder()
    encoder2.encode(_output("b", ["ab"], [[1, 2]]))
    delta = encoder2.encode(_output("b", ["abc"], [[1, 2, 3]]))
    assert delta[6][0][2] == "c" and delta[6][0][4] == [3] and delta[4] is None


def test_output_deltas_round_trip_a_real_engine(tiny_model_dir):
    engine = LLMEngine(_config(tiny_model_dir))
    engine.add_request("r", PROMPT, SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=6, logprobs=1,
                                                   prompt_logprobs=1, ignore_eos=True))
    encoder, decoder = OutputDeltaEncoder(), OutputDeltaDecoder()
    decoder.register("r", None, PROMPT)
    seen = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert decoder.decode(encoder.encode(out)) == out
            seen += 1
    assert seen >= 6
