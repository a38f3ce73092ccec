"""Faults: the engine core SIGKILLed mid-run under load, in the RAG case's compose stack (rag_stack.py).

    python -m reliability.faults --kills 2

Load: `--engine-clients` loops of streamed chat completions straight to the engine and `--app-clients`
loops of questions to the app's `/chat`, each request with a 60 s timeout. After `--load-s` seconds the
engine core process (the API server's `spawn_main` child, found through /proc) is killed with SIGKILL.
A poller reads the engine's `/health` every 50 ms. Recorded per kill: the in-flight streams that ended with
an SSE error frame (engine) or an `error` event (app), other failures, when `/health` first answered 503,
when the server stopped answering (it exits: engine_watchdog.py), when Docker restarted the container
(compose `restart: unless-stopped`; its RestartCount), when `/health` answered 200 again (time to
recovery, from the kill), and when the first request after the kill succeeded. After each recovery the
load runs `--load-s` more and every request must succeed. Bounded: at most `--recovery-timeout-s` per kill.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliability import rag_stack
from reliability.results import RESULTS, add_append_argument, save

QUESTION = "What does the pass statement do?"


@dataclass
class Outcomes:
    ok: list[float] = field(default_factory=list)            # finish times (monotonic)
    error_frames: list[tuple[float, str]] = field(default_factory=list)  # (time, "engine"|"app"): a stream
    # that ended with an SSE error frame (engine) or an `error` event (app)
    refused: list[tuple[float, str]] = field(default_factory=list)  # non-200 or transport errors
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, value) -> None:
        with self.lock:
            getattr(self, kind).append(value)


def _engine_request(client: httpx.Client, out: Outcomes) -> None:
    body = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            "max_tokens": 64, "ignore_eos": True, "stream": True}
    with client.stream("POST", rag_stack.url("ENGINE_PORT") + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            out.add("refused", (time.monotonic(), f"engine HTTP {r.status_code}"))
            return
        for line in r.iter_lines():
            if line.startswith("data: {\"error\""):
                out.add("error_frames", (time.monotonic(), "engine"))
                return
            if line == "data: [DONE]":
                out.add("ok", time.monotonic())
                return
    out.add("refused", (time.monotonic(), "engine stream ended without [DONE]"))


def _app_request(client: httpx.Client, out: Outcomes) -> None:
    with client.stream("POST", rag_stack.url("APP_PORT") + "/chat", json={"question": QUESTION, "max_tokens": 16}) as r:
        if r.status_code != 200:
            r.read()
            out.add("refused", (time.monotonic(), f"app HTTP {r.status_code}"))
            return
        for line in r.iter_lines():
            if line.startswith("event: error"):
                out.add("error_frames", (time.monotonic(), "app"))
                return
            if line.startswith("event: done"):
                out.add("ok", time.monotonic())
                return
    out.add("refused", (time.monotonic(), "app stream ended without done"))


def load(stop: threading.Event, request, out: Outcomes) -> None:
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            failures = len(out.refused) + len(out.error_frames)
            try:
                request(client, out)
            except httpx.HTTPError as exc:
                out.add("refused", (time.monotonic(), type(exc).__name__))
            if len(out.refused) + len(out.error_frames) > failures:
                stop.wait(0.5)  # a client backs off after a failure instead of spinning


def poll_health(stop: threading.Event, log: list[tuple[float, int]]) -> None:
    with httpx.Client(timeout=1) as client:
        while not stop.is_set():
            try:
                code = client.get(rag_stack.url("ENGINE_PORT") + "/health").status_code
            except httpx.HTTPError:
                code = 0  # nothing answers: the server exited or is starting
            log.append((time.monotonic(), code))
            stop.wait(0.05)


def restart_count() -> int:
    cid = rag_stack.compose("ps", "-q", "engine", timeout=60).stdout.strip()
    out = subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", cid], capture_output=True, text=True)
    return int(out.stdout.strip() or -1)


def one_kill(args, out: Outcomes, health: list[tuple[float, int]]) -> dict:
    core = rag_stack.engine_core_pid()
    if core is None:
        raise RuntimeError("no engine core process found")
    restarts_before = restart_count()
    n_ok, n_err, n_ref = len(out.ok), len(out.error_frames), len(out.refused)
    t_kill = time.monotonic()
    os.kill(core, signal.SIGKILL)
    deadline = t_kill + args.recovery_timeout_s
    first_503 = down = back = None
    while time.monotonic() < deadline and back is None:
        time.sleep(0.1)
        after = [(t, c) for t, c in list(health) if t > t_kill]
        first_503 = first_503 or next((t for t, c in after if c == 503), None)
        down = down or next((t for t, c in after if c == 0), None)
        if down is not None:
            back = next((t for t, c in after if c == 200 and t > down), None)
    ok_after = next((t for t in list(out.ok) if t > (back or deadline)), None)
    while ok_after is None and back is not None and time.monotonic() < deadline:
        time.sleep(0.2)
        ok_after = next((t for t in list(out.ok) if t > back), None)
    rel = lambda t: None if t is None else round(t - t_kill, 2)  # noqa: E731
    frames = out.error_frames[n_err:]
    in_flight = [k for t, k in frames if t <= (down or deadline)]  # before the server went away
    return {"engine_core_pid": core, "error_frames": len(frames),
            "error_frames_before_server_down": {"engine": in_flight.count("engine"), "app": in_flight.count("app")},
            "refused_or_failed": len(out.refused) - n_ref, "ok_during_recovery": len(out.ok) - n_ok,
            "first_failure_kinds": sorted({k for _, k in out.refused[n_ref:]})[:6],
            "health_503_after_s": rel(first_503), "server_down_after_s": rel(down),
            "health_200_again_after_s": rel(back), "first_success_after_s": rel(ok_after),
            "docker_restarts": restart_count() - restarts_before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--engine-clients", type=int, default=4)
    p.add_argument("--app-clients", type=int, default=2)
    p.add_argument("--load-s", type=float, default=20)
    p.add_argument("--recovery-timeout-s", type=float, default=300)
    p.add_argument("--keep-up", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS)
    add_append_argument(p, "faults")
    args = p.parse_args(argv)
    up_s = rag_stack.up()
    images = rag_stack.images()
    out, health, stop = Outcomes(), [], threading.Event()
    threads = [threading.Thread(target=poll_health, args=(stop, health), daemon=True)]
    threads += [threading.Thread(target=load, args=(stop, _engine_request, out), daemon=True)
                for _ in range(args.engine_clients)]
    threads += [threading.Thread(target=load, args=(stop, _app_request, out), daemon=True)
                for _ in range(args.app_clients)]
    for t in threads:
        t.start()
    kills = []
    try:
        time.sleep(args.load_s)
        for _ in range(args.kills):
            kills.append(one_kill(args, out, health))
            print(json.dumps(kills[-1]), flush=True)
            n_ok, n_bad = len(out.ok), len(out.refused) + len(out.error_frames)
            time.sleep(args.load_s)
            kills[-1]["after_recovery"] = {"ok": len(out.ok) - n_ok,
                                           "failed": len(out.refused) + len(out.error_frames) - n_bad}
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)
        if not args.keep_up:
            rag_stack.down()
    section = {"config": {"stack": "case_rag_chatbot/docker-compose.yaml, CPU profile (rag_stack.py)",
                          "supervisor": "compose restart: unless-stopped (the engine exits once its core is dead)",
                          "engine_clients": args.engine_clients, "app_clients": args.app_clients,
                          "engine_request": "chat, stream, max_tokens 64, ignore_eos", "load_s": args.load_s},
               "kills": kills, "stack_up_s": round(up_s, 1), "images": images}
    save("faults", section, args.out, args.append_to)
    recovered = all(k["health_200_again_after_s"] is not None and k["after_recovery"]["failed"] == 0
                    and k["after_recovery"]["ok"] > 0 for k in kills)
    return 0 if recovered else 1


if __name__ == "__main__":
    sys.exit(main())
