"""The RAG case's compose stack for the soak and fault runs: case_rag_chatbot/docker-compose.yaml with the CPU
profile (the fix's CPU config, a 1,024-token system prompt, 32-token answers: workload.yaml `cpu`), under one
project name on fixed loopback ports, from the images scripts/build_images.sh --case rag_chatbot built.

Resident memory is read from /proc on the host: the containers' processes are visible there (the sum of
VmRSS over each container's process tree, in MiB)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "case_rag_chatbot" / "docker-compose.yaml"
PROJECT = "reliability-rag"
PORTS = {"ENGINE_PORT": 18000, "CHROMA_PORT": 18001, "APP_PORT": 18080, "PROMETHEUS_PORT": 19090}
SERVICES = ("engine", "app", "chroma", "prometheus")


def env() -> dict[str, str]:
    images = Path(os.environ.get("SHARED_ENGINE_CACHE", Path.home() / ".cache" / "shared_engine")) / "images"
    names = dict(line.split("=", 1) for line in (images / "images.env").read_text().split())
    return {**os.environ, **names, **{k: str(v) for k, v in PORTS.items()},
            "ENGINE_CONFIG": "./the_fix/config_cpu.yaml", "SYSTEM_PROMPT_TOKENS": "1024", "RAG_MAX_TOKENS": "32"}


def url(port_name: str) -> str:
    return f"http://127.0.0.1:{PORTS[port_name]}"


def compose(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = ["docker", "compose", "-f", str(COMPOSE_FILE), "-p", PROJECT, *args]
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)


def up() -> float:
    """Start (or keep) the stack; returns the seconds `up --wait` took. Raises RuntimeError on failure."""
    start = time.monotonic()
    out = compose("up", "-d", "--wait", "--wait-timeout", "840")
    if out.returncode != 0:
        raise RuntimeError(f"compose up failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return time.monotonic() - start


def down(volumes: bool = False) -> None:
    compose("down", "--remove-orphans", "--timeout", "20", *(["--volumes"] if volumes else []), timeout=300)


def container_pid(service: str) -> int | None:
    cid = compose("ps", "-q", service, timeout=60).stdout.strip()
    if not cid:
        return None
    out = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", cid], capture_output=True, text=True,
                         timeout=60)
    pid = int(out.stdout.strip() or 0)
    return pid or None


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo and len(pids) < 1000:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return pids


def rss_mib(pid: int) -> float:
    """Sum of VmRSS over the process tree of `pid`, MiB (0 for a process that is gone)."""
    total_kib = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            pass
    return total_kib / 1024


def engine_core_pid() -> int | None:
    """The engine core's process (the API server's child running `EngineCore`), by its command line."""
    root = container_pid("engine")
    if root is None:
        return None
    for p in process_tree(root)[1:]:
        try:
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"multiprocessing.spawn" in cmdline or b"spawn_main" in cmdline:
            return p
    return None


def metric(name: str, timeout: float = 10) -> float | None:
    try:
        text = httpx.get(url("ENGINE_PORT") + "/metrics", timeout=timeout).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def images() -> dict[str, dict]:
    """The image each service runs (name, id, build time), for the results file: the code under test is the
    checkout that scripts/build_images.sh built them from, not necessarily the one writing the results."""
    found = {}
    for service in SERVICES:
        cid = compose("ps", "-q", service, timeout=60).stdout.strip()
        if not cid:
            continue
        out = subprocess.run(["docker", "inspect", "-f", "{{.Config.Image}} {{.Image}}", cid], capture_output=True,
                             text=True, timeout=60).stdout.split()
        if len(out) == 2:
            created = subprocess.run(["docker", "image", "inspect", "-f", "{{.Created}}", out[1]],
                                     capture_output=True, text=True, timeout=60).stdout.strip()
            found[service] = {"image": out[0], "id": out[1][:19], "created": created}
    return found
