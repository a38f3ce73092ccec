"""First attempt vs the fix on the same night's tickets, measured on this machine, and the fix's answers
checked against the online path's (greedy: the fix changes speed, not answers).

- First attempt: `shared_engine serve` at latency settings (first_attempt/config_cpu.yaml) and the script a
  team writes first: post each ticket's body to /v1/chat/completions, `--concurrency` (4) at a time.
- The fix: `run_batch` offline at throughput settings (the_fix/config_cpu.yaml): every ticket queued at once,
  longest first, the shared instruction prefilled once.

    python case_batch_summarisation/loadtest/first_vs_fix.py --num-tickets 200 --median-tokens 60 \\
        --max-ticket-tokens 600 --max-completion-tokens 48

Writes first_attempt/results_<tag>.json and the_fix/results_<tag>.json (tickets/s, output and prompt tokens/s,
prefix-cache share, engine config, commit, command) and `answers_equal` in the fix's file; `--tag` (default
`cpu`). `--server-url URL`: post to a server already running (the compose stack's `online` engine) instead
of starting one; `--skip-fix`: the first attempt only; `--deadline-s S`: the first attempt sends no ticket
after S seconds (a slow machine's run that must end: its rate over the tickets answered); `--answers-out
FILE`: the online answers, {custom_id: text}, for loadtest/compose_night.py to compare the DAG's outputs with.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "case_batch_summarisation"
sys.path.insert(0, str(ROOT))

from benchmarks.env_info import environment  # noqa: E402
from case_batch_summarisation.tickets.generator import TicketSpec, generate, write  # noqa: E402


def start_server(config: Path, port: int, log: Path) -> subprocess.Popen:
    import httpx

    cmd = [sys.executable, "-m", "shared_engine", "serve", "--config", str(config), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT)  # noqa: SIM115
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("server did not become healthy")


def first_attempt(rows: list[dict], args, tmp: Path) -> tuple[dict, dict]:
    """Post every ticket, `concurrency` at a time; returns (results, {custom_id: content})."""
    import httpx

    proc = None
    if not args.server_url:
        proc = start_server(CASE / "first_attempt" / "config_cpu.yaml", args.port, tmp / "server.log")
    answers, usage = {}, []
    try:
        client = httpx.Client(base_url=args.server_url or f"http://127.0.0.1:{args.port}", timeout=3600)

        deadline = time.perf_counter() + args.deadline_s if args.deadline_s else None

        def post(row):
            if deadline is not None and time.perf_counter() > deadline:
                return row["custom_id"], None, None  # not sent: the run's time is up
            r = client.post(row["url"], json=row["body"])
            r.raise_for_status()
            body = r.json()
            return row["custom_id"], body["choices"][0]["message"]["content"], body["usage"]

        started = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            for cid, content, u in pool.map(post, rows):
                if u is not None:
                    answers[cid] = content
                    usage.append(u)
                    last = time.perf_counter()
        elapsed = (last if usage else time.perf_counter()) - started
        config = client.get("/version").json().get("engine_config", {})
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    return _result("first_attempt", len(usage), elapsed, usage, config, args) | {
        "num_tickets_asked": len(rows), "deadline_s": args.deadline_s,
        "client": {"concurrency": args.concurrency, "script": "first_vs_fix.py:first_attempt"},
        "server": args.server_url or "started by the script (shared_engine serve)"}, answers


def the_fix(night: Path, args, tmp: Path) -> tuple[dict, dict]:
    import yaml

    from shared_engine import LLM
    from shared_engine.entrypoints.batch.run_batch import run_batch

    settings = yaml.safe_load((CASE / "the_fix" / "config_cpu.yaml").read_text())
    name = settings.pop("served_model_name")
    llm = LLM(**settings)
    summary = run_batch(llm, night, tmp / "out.jsonl", name, use_tqdm=False)
    answers, usage = {}, []
    for line in (tmp / "out.jsonl").read_text().splitlines():
        row = json.loads(line)
        answers[row["custom_id"]] = row["response"]["body"]["choices"][0]["message"]["content"]
        usage.append(row["response"]["body"]["usage"])
    result = _result("the_fix", summary.num_rows, summary.elapsed_s, usage, llm.engine.config.to_flat(), args)
    return result | {"run_batch_summary": summary.as_dict()}, answers


def _result(variant: str, n: int, elapsed: float, usage: list[dict], config: dict, args) -> dict:
    prompt = sum(u["prompt_tokens"] for u in usage)
    out = sum(u["completion_tokens"] for u in usage)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usage)
    return {"variant": variant, **environment(), "command": " ".join(sys.argv), "engine_config": config,
            "workload": {k: getattr(args, k) for k in ("num_tickets", "seed", "median_tokens", "max_ticket_tokens",
                                                        "max_completion_tokens")},
            "num_tickets": n, "elapsed_s": elapsed, "tickets_per_s": n / elapsed,
            "output_tokens_per_s": out / elapsed, "prompt_tokens_per_s": prompt / elapsed,
            "prompt_tokens": prompt, "completion_tokens": out, "cached_prompt_tokens": cached,
            "cached_share_of_prompt_tokens": cached / prompt if prompt else 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-tickets", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--median-tokens", type=float, default=60.0)
    p.add_argument("--max-ticket-tokens", type=int, default=600)
    p.add_argument("--max-completion-tokens", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--port", type=int, default=8731)
    p.add_argument("--out-dir", type=Path, default=CASE)
    p.add_argument("--tag", default="cpu", help="results_<tag>.json")
    p.add_argument("--server-url", help="a running server (default: start one at first_attempt/config_cpu.yaml)")
    p.add_argument("--skip-fix", action="store_true")
    p.add_argument("--answers-out", type=Path)
    p.add_argument("--deadline-s", type=float, default=None,
                   help="first attempt: send no ticket after this many seconds (the results count the "
                   "tickets answered, `num_tickets_asked` the night's)")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tmp = Path(tempfile.mkdtemp(prefix="first_vs_fix_"))
    spec = TicketSpec(median_tokens=args.median_tokens, max_tokens=args.max_ticket_tokens)
    write(tmp / "night.jsonl", generate(args.num_tickets, args.seed, spec,
                                        max_completion_tokens=args.max_completion_tokens))
    rows = [json.loads(line) for line in (tmp / "night.jsonl").read_text().splitlines()]
    first, online = first_attempt(rows, args, tmp)
    print(f"first attempt: {first['tickets_per_s']:.2f} tickets/s ({first['elapsed_s']:.0f} s)", flush=True)
    if args.answers_out:
        args.answers_out.write_text(json.dumps(online, indent=0, sort_keys=True))
    if args.skip_fix:
        (args.out_dir / "first_attempt" / f"results_{args.tag}.json").write_text(json.dumps(first, indent=2))
        return
    fix, offline = the_fix(tmp / "night.jsonl", args, tmp)
    print(f"the fix:       {fix['tickets_per_s']:.2f} tickets/s ({fix['elapsed_s']:.0f} s)", flush=True)
    same = [cid for cid in online if offline.get(cid) == online[cid]]
    fix["answers_equal"] = {"tickets": len(online), "equal": len(same),
                            "different": sorted(set(online) - set(same))}
    fix["speedup_vs_first_attempt"] = fix["tickets_per_s"] / first["tickets_per_s"]
    for variant, result in (("first_attempt", first), ("the_fix", fix)):
        (args.out_dir / variant / f"results_{args.tag}.json").write_text(json.dumps(result, indent=2))
    print(f"answers equal: {len(same)}/{len(online)}; speed-up {fix['speedup_vs_first_attempt']:.2f}x")


if __name__ == "__main__":
    main()
