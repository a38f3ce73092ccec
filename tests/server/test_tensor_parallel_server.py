"""`python -m shared_engine serve --tensor-parallel-size 2` on the CPU (gloo), with async scheduling on:
greedy completions equal the single-process engine's tokens (with chunked prefill and a prefix-cache
hit); a worker rank killed mid-stream ends the stream with an error frame, turns /health 503 and fails
the next request, within seconds (every client call has a timeout: a hang fails the test)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from shared_engine.entrypoints.openai.logprobs import TokenText
from tests.engine.tp_cases import MAX_TOKENS, PREFIX_PROMPT, PROMPTS, SETTINGS, reference
from tests.server.conftest import _stop, start_server


@pytest.fixture(scope="module")
def tp_server(tmp_path_factory, default_model_dir):
    reference()  # first, in this process (the server is other processes)
    flags = ["--tensor-parallel-size", "2", "--async-scheduling", "--max-model-len", str(SETTINGS["max_model_len"]),
             "--max-num-batched-tokens", str(SETTINGS["max_num_batched_tokens"]),
             "--block-size", str(SETTINGS["block_size"])]
    proc, srv = start_server(tmp_path_factory.mktemp("tp-server"), *flags)
    yield proc, srv
    _stop(proc)


def _completion_tokens(srv, prompt: str) -> tuple[list[str], int]:
    """The generated tokens (one piece per token id, from `logprobs.tokens`) and the cached prompt tokens."""
    body = {"model": srv.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "logprobs": 0}
    r = srv.post("/v1/completions", body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_tp_server_matches_single_process(tp_server, tokenizer):
    _, srv = tp_server
    ref, piece = reference(), TokenText(tokenizer)
    for prompt, want in zip(PROMPTS, ref["batch"]):
        got, _ = _completion_tokens(srv, prompt)
        assert got == [piece(t)[0] for t in want], prompt
    got, cached = _completion_tokens(srv, PREFIX_PROMPT)
    assert got == [piece(t)[0] for t in ref["prefix"]]
    assert cached == ref["prefix_cached"] >= 2 * SETTINGS["block_size"]


def _worker_pid(server_pid: int) -> int:
    """The tensor-parallel worker: a grandchild of the server (server → engine core → worker)."""
    def children(pid: int) -> list[int]:
        path = Path(f"/proc/{pid}/task/{pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    for core in children(server_pid):
        for pid in children(core):
            if b"worker_process" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("no tensor-parallel worker process found")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the worker through /proc (Linux)")
def test_killed_rank_fails_the_stream_and_health(tp_server):
    proc, srv = tp_server  # last in the module: it kills the server's worker
    assert srv.get("/health").status_code == 200
    worker = _worker_pid(proc.pid)
    body = {"model": srv.model, "prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    frames, started = [], time.monotonic()
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            frames.append(line[6:])
            if len(frames) == 1:
                os.kill(worker, signal.SIGKILL)
    assert time.monotonic() - started < 30
    error = json.loads(frames[-1] if frames[-1] != "[DONE]" else frames[-2]).get("error")
    assert error is not None and "rank 1" in error["message"], frames[-2:]
    assert len(frames) < 100  # ended by the error, not after its 200 tokens
    health = srv.get("/health", timeout=10)
    assert health.status_code == 503 and "rank 1" in health.text
    again = srv.post("/v1/completions", {"model": srv.model, "prompt": "Hi", "max_tokens": 2}, timeout=10)
    assert again.status_code == 503 and "error" in again.json()
