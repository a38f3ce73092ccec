"""`EngineServer`: `python -m shared_engine serve --config <variant config> <profile flags>` in a subprocess.

The variant's `config.yaml` holds the deployment's settings; the profile's `engine:` mapping (model, KV pool
size, max_model_len: what depends on the hardware) and any `--serve-arg` are added as flags, which win over
the YAML (the server's precedence: defaults < YAML < flags). The server's log goes to a file; its
10-second stats lines are what an operator greps, so the results keep the ones from the measured window.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use: `CUDA_VISIBLE_DEVICES`'s entries when set, else 0..n-1 for
    the n devices torch sees (none without CUDA)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def engine_flags(settings: dict) -> list[str]:
    """{"max_model_len": 4096, "enable_prefix_caching": False, "model": "x"} → serve arguments."""
    args: list[str] = []
    for key, value in settings.items():
        if key == "model":
            args.insert(0, str(value))  # positional
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        else:
            args += [flag, str(value)]
    return args


def preset_vocab_size(model: str) -> int | None:
    """The vocabulary size of a shape preset (`llama-3.1-8b`), None when `model` is not one."""
    from shared_engine.model_loader.model_source import PRESETS_DIR

    path = PRESETS_DIR / f"{model}.json"
    return json.loads(path.read_text())["vocab_size"] if path.exists() else None


class EngineServer:
    def __init__(self, config: Path | None, settings: dict, extra_args: list[str], log_path: Path,
                 startup_timeout_s: float = 900.0, gpu: int | None = None, wait: bool = True,
                 port: int | None = None) -> None:
        """`gpu`: pin the server to that CUDA device, one replica per GPU: the gpu-th entry of the caller's
        `CUDA_VISIBLE_DEVICES` when set, else device `gpu`; the server gets `--device cuda`, so a replica
        without its GPU fails at start instead of serving from the CPU. `wait=False` returns at once (start
        several, then `wait_healthy` each). `port`: a fixed loopback port (default: a free one)."""
        settings = dict(settings)
        vocab = preset_vocab_size(str(settings.get("model", "")))
        if settings.get("load_format") == "dummy" and vocab and "tokenizer" not in settings:
            from synthetic_tokenizer import write_tokenizer

            # Dummy weights have no tokenizer: without one the server cannot stream per-token deltas.
            settings["tokenizer"] = str(write_tokenizer(Path(tempfile.mkdtemp(prefix="case_tok_")), vocab))
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if config is not None and Path(config).resolve().is_relative_to(Path.cwd()):
            config = Path(config).resolve().relative_to(Path.cwd())  # a command that reads the same anywhere
        pin = [] if gpu is None else ["--device", "cuda"]
        self.args = ["serve", *engine_flags(settings), *(["--config", str(config)] if config else []),
                     "--port", str(self.port), "--uvicorn-log-level", "warning", *pin, *extra_args]
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus()[gpu]
        self.gpu = None if gpu is None else env["CUDA_VISIBLE_DEVICES"]
        self.startup_timeout_s = startup_timeout_s
        self.proc = subprocess.Popen([sys.executable, "-m", "shared_engine", *self.args], stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_healthy()

    @property
    def command(self) -> str:
        prefix = "" if self.gpu is None else f"CUDA_VISIBLE_DEVICES={self.gpu} "
        return prefix + "python -m shared_engine " + " ".join(self.args)

    def wait_healthy(self) -> None:
        timeout_s = self.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_tail(30))
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s; log {self.log_path}")

    def log_tail(self, lines: int) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_lines(self, contains: str) -> list[str]:
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if contains in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
