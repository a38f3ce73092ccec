"""Abuse-shaped traffic against a local server, beside one well-behaved client.

    python -m reliability.abuse                  # starts a server on the default model (max_model_len 1024)
    python -m reliability.abuse --url http://127.0.0.1:8000

1. Each request of abuse_cases.CASES once: its status, whether the body is the OpenAI error envelope, and
   the time to the answer. Passing: a 4xx with the envelope.
2. Slowloris: `--slow-connections` sockets that send a request's headers one byte every `--slow-byte-s`
   seconds, and as many that send full headers and then trickle the body, held open for the loaded phase;
   recorded: how many the server closed, and whether it kept answering others.
3. The well-behaved client: `--probes` sequential requests (completions, greedy, max_tokens 8) unloaded,
   then again while the slowloris sockets are open and `--abuse-workers` processes send the abuse cases in
   a loop, then unloaded once more. Passing: the loaded p95 latency within 1.5x of the unloaded p95 (the
   larger of the two unloaded phases, which bracket the loaded one).
Bounded: every request has a 60 s timeout, each phase at most `--probes` requests, abuse workers stop
with the loaded phase (and after `--max-abuse-requests` in all).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from reliability.abuse_cases import CASES, is_envelope, raw_request
from reliability.cpu_meter import CpuMeter, descendants, listening_pid
from reliability.results import RESULTS, percentile

PROBE = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0}


def send_raw(addr: tuple[str, int], raw: bytes) -> tuple[int | str, bytes]:
    """Send one prebuilt request; (status code, or why there is none; response body). Stops sending once
    the server has answered (a 413 or 431 before the whole request is in)."""
    answer = b""
    try:
        with socket.create_connection(addr, timeout=60) as sock:
            view = memoryview(raw)
            try:
                for i in range(0, len(raw), 65536):
                    if select.select([sock], [], [], 0)[0]:
                        break
                    sock.sendall(view[i:i + 65536])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before the whole request was in
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except ConnectionResetError:
                pass
    except OSError as exc:
        return type(exc).__name__, b""
    head, _, body = answer.partition(b"\r\n\r\n")
    try:
        return int(head.split(b" ", 2)[1]), body
    except (IndexError, ValueError):
        return "no response", b""


def send_case(addr: tuple[str, int], name: str, raw: bytes | None = None) -> dict:
    start = time.monotonic()
    status, body = send_raw(addr, raw if raw is not None else raw_request(name))
    envelope = is_envelope(body)
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


def _addr(url: str) -> tuple[str, int]:
    u = urlparse(url)
    return u.hostname, u.port


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


def abuse_loop(url: str, stop, budget: int, start: int, results) -> None:
    """One abuse worker (a process of its own: building some abusive requests costs the client seconds of
    Python, e.g. httpx's cookie handling of 5,000 headers, which in the probe's process would hold the GIL
    and delay the probe itself). Puts its list of case results on `results` when done."""
    names, out = sorted(CASES), []
    raws = {name: raw_request(name) for name in names}
    addr, i = _addr(url), start
    while not stop.is_set() and len(out) < budget:
        name = names[i % len(names)]
        out.append(send_case(addr, name, raws[name]))
        i += 1
    results.put((out, time.monotonic()))


def run(url: str, probes: int, slow: int, slow_byte_s: float, workers: int, max_abuse: int) -> dict:
    load = {"start": os.getloadavg()}
    server_pid, abuse_pids = listening_pid(_addr(url)[1]), []
    meter = CpuMeter({"api_server": lambda: [server_pid] if server_pid else [],
                      "engine_core_process": lambda: descendants(server_pid) if server_pid else [],
                      "probe_and_slowloris_client": lambda: [os.getpid()], "abuse_clients": lambda: abuse_pids})
    once = [send_case(_addr(url), name) for name in CASES]
    load["unloaded_before"] = os.getloadavg()
    snaps = [meter.snapshot()]
    unloaded = probe_latencies(url, probes)
    snaps.append(meter.snapshot())
    load["loaded_start"] = os.getloadavg()
    loris = Slowloris(url, slow, slow_byte_s)
    loris.start()
    mp = multiprocessing.get_context("spawn")
    stop, queue, looped = mp.Event(), mp.Queue(), []
    procs = [mp.Process(target=abuse_loop, args=(url, stop, max_abuse // workers, i * 7, queue), daemon=True)
             for i in range(workers)]
    for proc in procs:
        proc.start()
    abuse_pids.extend(proc.pid for proc in procs)
    time.sleep(5)  # the workers' interpreters start (spawn) before the loaded phase is timed
    loaded_start, ends = time.monotonic(), []
    snaps.append(meter.snapshot())
    try:
        loaded = probe_latencies(url, probes)
    finally:
        loaded_s = time.monotonic() - loaded_start
        snaps.append(meter.snapshot())  # before the abuse workers exit
        stop.set()
        for _ in procs:
            out, end = queue.get(timeout=180)
            looped.extend(out)
            ends.append(end)
        for proc in procs:
            proc.join(timeout=30)
        slowloris = loris.close()
    load["loaded_end"] = os.getloadavg()
    snaps.append(meter.snapshot())
    unloaded_after = probe_latencies(url, probes)
    snaps.append(meter.snapshot())
    load["end"] = os.getloadavg()
    p95 = {name: round(percentile(v, 0.95) * 1000, 1) for name, v in
           (("unloaded_before", unloaded), ("loaded", loaded), ("unloaded_after", unloaded_after))}
    baseline = max(p95["unloaded_before"], p95["unloaded_after"])
    return {
        "cases": once,
        "cases_failing": [c["case"] for c in once if not c["ok"]],
        "looped_requests": len(looped),
        # the abuse loop ran over the whole loaded phase unless its request budget ran out first
        "loaded_phase_s": round(loaded_s, 1),
        "abuse_loop_within_loaded_phase_s": round(min(max(ends) - loaded_start, loaded_s), 1),
        "looped_failing": sorted({c["case"] for c in looped if not c["ok"]}),
        "looped_5xx": sum(1 for c in looped if isinstance(c["status"], int) and c["status"] >= 500),
        "slowloris": slowloris,
        "probe_p95_ms": p95, "probe_p50_ms": {name: round(percentile(v, 0.5) * 1000, 1) for name, v in
                                              (("unloaded_before", unloaded), ("loaded", loaded),
                                               ("unloaded_after", unloaded_after))},
        "loaded_over_unloaded_p95": round(p95["loaded"] / baseline, 2),
        "within_1_5x": p95["loaded"] <= 1.5 * baseline,
        # average cores used in each phase; "machine" is every process on it (other users included)
        "cores_used": {"unloaded_before": CpuMeter.cores(snaps[0], snaps[1]),
                       "loaded": CpuMeter.cores(snaps[2], snaps[3]),
                       "unloaded_after": CpuMeter.cores(snaps[4], snaps[5])},
        "load_average_1_5_15_min": {k: [round(x, 2) for x in v] for k, v in load.items()},
        "probe_seconds": {"unloaded_before": [round(x, 3) for x in unloaded], "loaded": [round(x, 3) for x in loaded],
                          "unloaded_after": [round(x, 3) for x in unloaded_after]},
    }


def main(argv: list[str] | None = None) -> int:
    from reliability.local_server import local_server
    from reliability.results import append_entry, write_section

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url")
    p.add_argument("--probes", type=int, default=40)
    p.add_argument("--slow-connections", type=int, default=200)
    p.add_argument("--slow-byte-s", type=float, default=2.0)
    p.add_argument("--abuse-workers", type=int, default=2)
    p.add_argument("--max-abuse-requests", type=int, default=2000)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--append-to", metavar="KEY",
                   help="append the run to the list under KEY in the results file instead of replacing 'abuse'")
    args = p.parse_args(argv)
    flags = ["--max-model-len", "1024"]
    with local_server(flags, url=args.url) as url:
        report = run(url, args.probes, args.slow_connections, args.slow_byte_s, args.abuse_workers,
                     args.max_abuse_requests)
    report["config"] = {"server": "python -m shared_engine serve " + " ".join(flags), "probes": args.probes,
                        "probe_request": PROBE, "slow_connections_per_kind": args.slow_connections,
                        "slow_byte_s": args.slow_byte_s, "abuse_workers": args.abuse_workers}
    if args.append_to:
        append_entry(args.append_to, report, args.out)
    else:
        write_section("abuse", report, args.out)
    for c in report["cases"]:
        print(f"{c['case']:28s} {c['status']!s:24s} envelope={c['envelope']!s:5s} {c['seconds']:7.3f} s")
    print({k: v for k, v in report.items() if k != "cases"})
    return 0 if not report["cases_failing"] and report["within_1_5x"] else 1


if __name__ == "__main__":
    sys.exit(main())
