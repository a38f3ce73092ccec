"""The case benchmark: the session trace replayed through nginx over two engine replicas, first attempt vs the
fix, one results file per variant and profile.

    # this CPU, scaled down (SmolLM2-135M, sessions up to ~1.8k tokens): two servers, an nginx on loopback
    python -m case_coding_agent.loadtest.run_case --profile cpu --variant first_attempt
    python -m case_coding_agent.loadtest.run_case --profile cpu --variant the_fix
    # servers (or an nginx) already running: --base-url http://127.0.0.1:8000 (no servers started)

Results: `<variant>/results_<profile>.json`: the command, commit, hardware and the machine's load (load
averages before and after, CPU count), each replica's server command and config, the trace, every turn
(send, first token, chunk times, prompt and cached tokens, replica) and the summary (`summary.py`), with each
replica's engine counters over the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import yaml

from case_coding_agent.loadtest.engine_metrics import delta, scrape
from case_coding_agent.loadtest.make_trace import TRACES
from case_coding_agent.loadtest.replay import replay
from case_coding_agent.loadtest.session_gen import CASE_DIR, WORKLOAD_FILE
from case_coding_agent.loadtest.summary import summarize
from case_coding_agent.loadtest.trace import read_trace, sessions, synthetic_token_ids
from case_coding_agent.router import nginx_conf

sys.path.insert(0, str(CASE_DIR.parent / "case_rag_chatbot" / "loadtest"))  # the generic EngineServer
from engine_server import EngineServer, free_port  # noqa: E402


class Nginx:
    """nginx (the host's, Debian's package) on a loopback port with `router.nginx_conf`."""

    def __init__(self, upstreams: list[str], policy: str, log_path: Path) -> None:
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        self.prefix = Path(tempfile.mkdtemp(prefix="case_nginx_"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.prefix / "nginx.conf").write_text(nginx_conf(upstreams, self.port, policy, str(self.prefix)))
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([exe, "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf"), "-g",
                                      "daemon off;"], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/nginx-health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"nginx did not start; log {log_path}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        access = self.prefix / "access.log"
        if access.exists():
            self._log.write(access.read_text())
        self._log.close()
        shutil.rmtree(self.prefix, ignore_errors=True)


def load_variant(variant: str, profile: str) -> tuple[Path, str, dict]:
    """(config file, routing policy, the profile's engine flags) from workload.yaml."""
    workload = yaml.safe_load(WORKLOAD_FILE.read_text())
    v = workload["variants"][variant]
    return CASE_DIR / v["config"][profile], v["routing"], workload["engine"][profile]


def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "loadavg": list(os.getloadavg())}


def kv_pool_tokens(log_path: Path) -> int | None:
    """A server's KV pool in tokens, from its start-up line ("KV cache size: 444,848 tokens, ..."); None if absent."""
    try:
        found = re.search(r"KV cache size: ([\d,]+) tokens", log_path.read_text(errors="replace"))
    except OSError:
        return None
    return int(found.group(1).replace(",", "")) if found else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--variant", required=True, choices=["first_attempt", "the_fix"])
    ap.add_argument("--trace", type=Path, help="default: loadtest/traces/<profile>/trace.jsonl")
    ap.add_argument("--replicas", type=int, default=2, help="1: one engine, no nginx (the brief's one GPU)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve flag (repeatable)")
    ap.add_argument("--first-port", type=int, default=18101, help="replica i listens on first-port + i")
    ap.add_argument("--synthetic-prompts", action="store_true", help="send the trace's synthetic token ids "
                    "(dummy weights, the h200 profile) instead of the prompt texts")
    ap.add_argument("--gpus", action="store_true", help="one CUDA device per replica")
    ap.add_argument("--deadline-s", type=float, help="stop the replay this many seconds after it starts and record "
                    "the turns that finished (the results file says the run was cut); default: none")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    trace = args.trace or TRACES / args.profile / "trace.jsonl"
    header, records = read_trace(trace)
    if args.synthetic_prompts:  # dummy weights: token ids with the trace's block sharing, kinds from the shape
        last = {s: t[-1].turn for s, t in sessions(records).items()}
        prompts = {r.request_id: {"kind": "cold" if r.session_id.startswith("cold") and r.turn == 1 else
                                  "edit" if r.turn == last[r.session_id] and r.turn > 1 else "read"}
                   for r in records}
    else:
        lines = (trace.parent / "prompts.jsonl").read_text().splitlines()
        prompts = {r["request_id"]: r for r in map(json.loads, lines)}
    config, policy, flags = load_variant(args.variant, args.profile)
    out = args.out or CASE_DIR / args.variant / f"results_{args.profile}.json"
    extra = [part for a in args.serve_arg for part in (a.split("=", 1) if a.startswith("--") and "=" in a else [a])]
    load_before = machine()
    # the commit as the run starts: the run rewrites its own tracked server logs, which would mark every
    # re-run of a committed variant "-dirty" if git were asked afterwards
    from benchmarks.env_info import git_commit

    commit = git_commit()
    # fixed ports: nginx's hash ring is built from the upstream addresses, so the same ports give the same
    # session-to-replica split on every run
    servers = [EngineServer(config, flags, extra, out.with_suffix(f".server{i}.log"), wait=False,
                            port=args.first_port + i, gpu=i if args.gpus else None) for i in range(args.replicas)]
    router = None
    try:
        for s in servers:
            s.wait_healthy()
        if args.replicas > 1:
            router = Nginx([s.url.removeprefix("http://") for s in servers], policy, out.with_suffix(".nginx.log"))
        else:  # one replica (one GPU): nothing to route, the load test talks to it directly
            policy = "none (one replica)"
        url = router.url if router is not None else servers[0].url
        card = httpx.get(servers[0].url + "/v1/models", timeout=30).json()["data"][0]
        engine_config = httpx.get(servers[0].url + "/version", timeout=30).json().get("engine_config") or {}
        before = [scrape(s.url) for s in servers]
        started = time.time()
        vocab = int(card.get("vocab_size") or 32000)
        ids = (lambda r: synthetic_token_ids(r, header["block_tokens"], vocab)) if args.synthetic_prompts else None
        cut = []
        turns = asyncio.run(replay(url, card["id"], records, prompts, token_ids=ids, deadline_s=args.deadline_s,
                                   on_deadline=lambda: cut.append(True)))
        wall_s = time.time() - started
        after = [scrape(s.url) for s in servers]
    finally:
        if router is not None:
            router.stop()
        for s in servers:
            s.stop()
    from benchmarks.env_info import environment

    rows = [asdict(t) | {"ttft_s": t.ttft_s, "tpot_s": t.tpot_s} for t in turns]
    pools = [kv_pool_tokens(s.log_path) for s in servers]
    # the hit-rate ceiling's granularity: the engine's block, or with synthetic ids the trace's hash block (two
    # turns' ids agree only over whole hash blocks, trace.synthetic_token_ids; sim_case.py does the same)
    block_size = header["block_tokens"] if args.synthetic_prompts else int(engine_config.get("block_size", 16))
    replicas = {s.url.removeprefix("http://"): delta(b, a) for s, b, a in zip(servers, before, after)}
    record = {"case": "coding_agent", "profile": args.profile, "variant": args.variant,
              "command": "python -m case_coding_agent.loadtest.run_case " + " ".join(sys.argv[1:] or argv or []),
              **environment(), "commit": commit, "machine_before": load_before, "machine_after": machine(),
              "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")},
              "server_commands": [s.command for s in servers], "routing": policy,
              "config_file": str(config.relative_to(CASE_DIR)), "config_yaml": config.read_text(),
              "profile_engine_flags": flags, "model": card, "engine_config": engine_config,
              "trace": str(trace.relative_to(CASE_DIR)), "trace_header": header, "wall_s": round(wall_s, 1),
              # a run stopped at --deadline-s: its summary covers only the turns that finished by then, so its
              # TTFT and during-cold figures lean to short turns and its peak KV need is understated
              "complete": not cut, "cut_at_deadline": bool(cut), "trace_turns": len(records),
              "deadline_s": args.deadline_s,
              "summary": summarize(rows, block_size), "replica_counters": replicas, "turns": rows}
    summary = record["summary"]
    summary["kv_pool_tokens"] = pools  # a replica's pool, from its start-up log line
    # the live sessions' peak need over the pools they share (one replica: exactly its pool)
    summary["kv_oversubscription"] = (round(summary["peak_kv_need_tokens"] / sum(pools), 3)
                                      if all(pools) and pools else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "replicas_per_session"}, indent=1))
    note = f"; CUT at the deadline: {len(turns)} of {len(records)} turns finished" if cut else ""
    print(f"wrote {out} ({wall_s:.0f} s{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
