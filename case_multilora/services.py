"""Start the case's processes on this machine (no Docker): the engine with the case's config and the trained
adapters, and the gateway in front of it. Used by the load test and the tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

CASE_DIR = Path(__file__).resolve().parent
REPO = CASE_DIR.parent
ENGINE_API_KEY = "sk-engine-local"


@dataclass
class Service:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(name: str, cmd: list[str], port: int, log_dir: Path, env: dict[str, str] | None = None,
                  timeout_s: float = 600) -> Service:
    """`cmd` with our environment plus `env`, once `http://127.0.0.1:{port}/health` answers 200.

    Raises:
        RuntimeError: the process exited or was not healthy within `timeout_s` (with the log's tail)."""
    log_path = log_dir / f"{name}-{port}.log"
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    service = Service(name, f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(service.url + "/health", timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    service.stop()
    raise RuntimeError(f"{name} not healthy in {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")


def lora_flags(adapters: dict[str, Path]) -> list[str]:
    """The configs name /adapters/<name> (compose, k8s); here the adapters' own directories (flags win)."""
    root = os.path.commonpath([str(p.resolve()) for p in adapters.values()])
    return ["--lora-modules", *(f"{n}={p.resolve()}" for n, p in adapters.items()), "--allowed-local-lora-path", root]


def start_engine(log_dir: Path, config: Path, adapters: dict[str, Path] | None, *flags: str) -> Service:
    """`python -m shared_engine serve --config CONFIG` (the adapters' paths replacing the config's)."""
    port = free_port()
    cmd = [sys.executable, "-m", "shared_engine", "serve", "--config", str(config), "--host", "127.0.0.1",
           "--port", str(port), "--uvicorn-log-level", "warning", *(lora_flags(adapters) if adapters else []),
           *flags]
    return start_service("engine", cmd, port, log_dir, env={"SHARED_ENGINE_API_KEY": ENGINE_API_KEY})


def start_gateway(log_dir: Path, engine_url: str, tenants_file: Path, env: dict[str, str] | None = None) -> Service:
    port = free_port()
    cmd = [sys.executable, "-m", "case_multilora.app", "serve", "--host", "127.0.0.1", "--port", str(port)]
    # the repository first, then whatever the caller had (carried wheels in a --target folder on the H200)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    gateway_env = {"ENGINE_URL": engine_url, "ENGINE_API_KEY": ENGINE_API_KEY, "TENANTS_FILE": str(tenants_file),
                   "PYTHONPATH": path, **(env or {})}
    return start_service("gateway", cmd, port, log_dir, env=gateway_env)
