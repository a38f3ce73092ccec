"""Servers for the HTTP tests: `python -m shared_engine serve` subprocesses on 127.0.0.1, free ports, the
default model. `server` (max_model_len 1024) serves most tests; `small_server` (max_model_len 128) serves
the context-overflow rows and schemathesis (short contexts keep fuzzed generations short)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[2]
KV_CACHE_MEMORY = str(512 * 1024**2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    model: str
    log_path: Path
    max_model_len: int

    def post(self, path: str, body, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=kwargs.pop("timeout", 120), **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kwargs.pop("timeout", 30), **kwargs)

    def stream(self, path: str, body: dict) -> list[dict]:
        """The parsed `data:` frames of an SSE response (without `[DONE]`, which must end it)."""
        frames = []
        with httpx.stream("POST", self.url + path, json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frames.append(line[6:])
        assert frames and frames[-1] == "[DONE]", frames[-3:]
        return [json.loads(f) for f in frames[:-1]]

    def metric(self, name: str) -> float:
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


def start_server(tmp_dir: Path, *flags: str) -> tuple[subprocess.Popen, Server]:
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, "-m", "shared_engine", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--kv-cache-memory", KV_CACHE_MEMORY, "--uvicorn-log-level", "warning", *flags]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError(f"server did not start:\n{log_path.read_text()[-3000:]}")
    key = flags[flags.index("--api-key") + 1] if "--api-key" in flags else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    models = httpx.get(url + "/v1/models", headers=headers).json()["data"]
    return proc, Server(url, models[0]["id"], log_path, models[0]["max_model_len"])


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory, default_model_dir):
    proc, srv = start_server(tmp_path_factory.mktemp("server"), "--max-model-len", "1024")
    yield srv
    _stop(proc)


@pytest.fixture(scope="session")
def small_server(tmp_path_factory, default_model_dir):
    proc, srv = start_server(tmp_path_factory.mktemp("small-server"), "--max-model-len", "128")
    yield srv
    _stop(proc)


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))
