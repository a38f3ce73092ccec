"""Abuse-shaped traffic against a local server, beside one well-behaved client.

    python -m reliability.abuse                  # starts a server on the default model (max_model_len 1024)
    python -m reliability.abuse --url http://127.0.0.1:8000

1. Each request of abuse_cases.CASES once: its status, whether the body is the OpenAI error envelope, and
   the time to the answer. Passing: a 4xx with the envelope.
2. Slowloris: `--slow-connections` sockets that send a request's headers one byte every `--slow-byte-s`
   seconds, and as many that send full headers and then trickle the body, held open for the loaded phase;
   recorded: how many the server closed, and whether it kept answering others.
3. The well-behaved client: `--probes` sequential requests (completions, greedy, max_tokens 8) unloaded,
   then again while the slowloris sockets are open and `--abuse-workers` threads send the abuse cases in a
   loop, then unloaded once more. Passing: the loaded p95 latency within 1.5x of the unloaded p95 (the
   larger of the two unloaded phases, which bracket the loaded one).
Bounded: every request has a 60 s timeout, each phase at most `--probes` requests, abuse workers stop
with the loaded phase (and after `--max-abuse-requests` in all).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from reliability.abuse_cases import CASES, is_envelope
from reliability.results import RESULTS, percentile

PROBE = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0}


def send_case(client: httpx.Client, url: str, name: str) -> dict:
    path, kwargs = CASES[name]
    start = time.monotonic()
    try:
        r = client.request("POST", url + path, **kwargs)
        status, envelope = r.status_code, is_envelope(r.content)
    except httpx.HTTPError as exc:
        status, envelope = f"{type(exc).__name__}", False
    seconds = round(time.monotonic() - start, 3)
    ok = isinstance(status, int) and 400 <= status < 500 and envelope
    return {"case": name, "status": status, "envelope": envelope, "seconds": seconds, "ok": ok}


def probe_latencies(url: str, count: int) -> list[float]:
    out = []
    with httpx.Client(timeout=60) as client:
        for _ in range(count):
            start = time.monotonic()
            r = client.post(url + "/v1/completions", json=PROBE)
            r.raise_for_status()
            out.append(time.monotonic() - start)
    return out


class Slowloris:
    """`n` sockets trickling request headers, `n` trickling a declared body, one byte per `every_s`."""

    def __init__(self, url: str, n: int, every_s: float) -> None:
        u = urlparse(url)
        self.addr, self.n, self.every_s = (u.hostname, u.port), n, every_s
        self.socks: list[tuple[str, socket.socket]] = []
        self.closed_by_server = {"headers": 0, "body": 0}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        for kind in ("headers", "body"):
            for _ in range(self.n):
                s = socket.create_connection(self.addr, timeout=5)
                if kind == "headers":
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                else:
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
                s.setblocking(False)
                self.socks.append((kind, s))
        self.thread.start()

    def _run(self) -> None:
        alive = list(self.socks)
        for _ in range(100_000):
            if self.stop.wait(self.every_s) or not alive:
                return
            for kind, s in list(alive):
                try:
                    s.send(b"X-a: b\r\n"[:1] if kind == "headers" else b" ")
                    s.recv(1, socket.MSG_PEEK)  # data (an error response) or b"" (closed): it reacted
                    raise ConnectionError
                except BlockingIOError:
                    continue  # sent; nothing to read: still open
                except OSError:
                    self.closed_by_server[kind] += 1
                    alive.remove((kind, s))

    def close(self) -> dict:
        self.stop.set()
        self.thread.join(timeout=30)
        for _, s in self.socks:
            s.close()
        return {"connections_per_kind": self.n, "closed_by_server": dict(self.closed_by_server)}


def abuse_loop(url: str, stop: threading.Event, budget: list[int], results: list[dict]) -> None:
    names = sorted(CASES)
    with httpx.Client(timeout=60) as client:
        i = 0
        while not stop.is_set() and budget[0] > 0:
            budget[0] -= 1
            results.append(send_case(client, url, names[i % len(names)]))
            i += 1


def run(url: str, probes: int, slow: int, slow_byte_s: float, workers: int, max_abuse: int) -> dict:
    with httpx.Client(timeout=60) as client:
        once = [send_case(client, url, name) for name in CASES]
    unloaded = probe_latencies(url, probes)
    loris = Slowloris(url, slow, slow_byte_s)
    loris.start()
    stop, budget, looped = threading.Event(), [max_abuse], []
    threads = [threading.Thread(target=abuse_loop, args=(url, stop, budget, looped), daemon=True)
               for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        loaded = probe_latencies(url, probes)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        slowloris = loris.close()
    unloaded_after = probe_latencies(url, probes)
    p95 = {name: round(percentile(v, 0.95) * 1000, 1) for name, v in
           (("unloaded_before", unloaded), ("loaded", loaded), ("unloaded_after", unloaded_after))}
    baseline = max(p95["unloaded_before"], p95["unloaded_after"])
    return {
        "cases": once,
        "cases_failing": [c["case"] for c in once if not c["ok"]],
        "looped_requests": len(looped),
        "looped_failing": sorted({c["case"] for c in looped if not c["ok"]}),
        "looped_5xx": sum(1 for c in looped if isinstance(c["status"], int) and c["status"] >= 500),
        "slowloris": slowloris,
        "probe_p95_ms": p95, "probe_p50_ms": {name: round(percentile(v, 0.5) * 1000, 1) for name, v in
                                              (("unloaded_before", unloaded), ("loaded", loaded),
                                               ("unloaded_after", unloaded_after))},
        "loaded_over_unloaded_p95": round(p95["loaded"] / baseline, 2),
        "within_1_5x": p95["loaded"] <= 1.5 * baseline,
    }


def main(argv: list[str] | None = None) -> int:
    from reliability.local_server import local_server
    from reliability.results import write_section

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url")
    p.add_argument("--probes", type=int, default=40)
    p.add_argument("--slow-connections", type=int, default=200)
    p.add_argument("--slow-byte-s", type=float, default=2.0)
    p.add_argument("--abuse-workers", type=int, default=2)
    p.add_argument("--max-abuse-requests", type=int, default=2000)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    flags = ["--max-model-len", "1024"]
    with local_server(flags, url=args.url) as url:
        report = run(url, args.probes, args.slow_connections, args.slow_byte_s, args.abuse_workers,
                     args.max_abuse_requests)
    report["config"] = {"server": "python -m shared_engine serve " + " ".join(flags), "probes": args.probes,
                        "probe_request": PROBE, "slow_connections_per_kind": args.slow_connections,
                        "slow_byte_s": args.slow_byte_s, "abuse_workers": args.abuse_workers}
    write_section("abuse", report, args.out)
    for c in report["cases"]:
        print(f"{c['case']:28s} {c['status']!s:24s} envelope={c['envelope']!s:5s} {c['seconds']:7.3f} s")
    print({k: v for k, v in report.items() if k != "cases"})
    return 0 if not report["cases_failing"] and report["within_1_5x"] else 1


if __name__ == "__main__":
    sys.exit(main())
