"""The case benchmark: closed-loop chat users against the engine, first attempt vs the fix, one results file
per variant and hardware profile.

    # this CPU, scaled down (8 users, 1k system prompt): starts the server with each variant's config
    python case_rag_chatbot/loadtest/run_case.py --profile cpu --variant first_attempt
    python case_rag_chatbot/loadtest/run_case.py --profile cpu --variant the_fix
    # the H200, the brief's scale (200 users, 4k system prompt, llama-3.1-8b dummy weights)
    python case_rag_chatbot/loadtest/run_case.py --profile h200 --variant the_fix
    # the highest load the fix sustains: the same server, one measured window per user count
    python case_rag_chatbot/loadtest/run_case.py --profile h200 --variant the_fix --sweep-users 200,300,400
    # a server that is already running (its own config is read from /version)
    python case_rag_chatbot/loadtest/run_case.py --profile cpu --variant the_fix --base-url http://127.0.0.1:8000

Results: `<variant>/results_<profile>.json` (a sweep: `<variant>/sweep_<profile>.json`), with the hardware,
model, engine config, commit, command, workload, every figure (mean/median/p90/p95/p99) and the targets
check. Prompts are token ids in the app's prompt order (see `prompt_builder.py`); answers have fixed
lengths (`ignore_eos`), so dummy weights measure the same work as real ones.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # the repository root (benchmarks.env_info)

import httpx  # noqa: E402
from case_workload import CASE_DIR, WORKLOAD_FILE, RequestSampler, load_profile, load_variant  # noqa: E402
from closed_loop import LoadShape, idle_reference, run_load  # noqa: E402
from engine_server import EngineServer, visible_gpus  # noqa: E402
from prompt_builder import builder_name, segment_order  # noqa: E402
from summary import check_targets, engine_summary, latency_summary, system_prompt_hits  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="workload.yaml profile: cpu or h200")
    p.add_argument("--workload", type=Path, default=WORKLOAD_FILE, help="the workload file (default: the case's)")
    p.add_argument("--variant", required=True, choices=["first_attempt", "the_fix"])
    p.add_argument("--base-url", help="target running servers instead of starting them (comma-separated "
                   "replicas)")
    p.add_argument("--users", type=int, help="override the profile's users")
    p.add_argument("--think-time-mean-s", type=float, help="override the profile's mean think time")
    p.add_argument("--warmup-s", type=float)
    p.add_argument("--duration-s", type=float)
    p.add_argument("--drain-s", type=float, default=60.0, help="in-flight requests' grace after the window")
    p.add_argument("--sweep-users", help="comma-separated user counts: one window each on the same server")
    p.add_argument("--serve-arg", action="append", default=[], help="extra serve flag, e.g. "
                   "--serve-arg=--max-num-batched-tokens=512 (repeatable; wins over the config file)")
    p.add_argument("--replicas", type=int, help="engine servers, one per GPU, users spread over them "
                   "(default: the variant's `replicas` for the profile in workload.yaml, else 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="default: <variant>/results_<profile>.json (sweep_<profile>.json)")
    return p.parse_args(argv)


def split_serve_args(values: list[str]) -> list[str]:
    out = []
    for value in values:
        out += value.split("=", 1) if value.startswith("--") and "=" in value else [value]
    return out


def check_same_config(base_urls: list[str]) -> None:
    """Replicas must serve the same model under the same engine config (`/version`), since the results file
    records the first one's for all."""
    # `tokenizer` is a path on each server's machine (a synthetic one is written per server for dummy weights)
    configs = [{k: v for k, v in (httpx.get(u + "/version", timeout=30).json().get("engine_config") or {}).items()
                if k != "tokenizer"} for u in base_urls]
    for url, config in zip(base_urls[1:], configs[1:]):
        if config != configs[0]:
            diff = sorted(k for k in set(config) | set(configs[0]) if config.get(k) != configs[0].get(k))
            raise SystemExit(f"replica {url} runs another engine config than {base_urls[0]}: {diff}")


def measure(base_urls: list[str], profile, variant: dict, shape: LoadShape, seed: int) -> dict:
    base_url = base_urls[0]  # replicas run the same config: the first answers for all
    card = httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]
    engine_config = httpx.get(base_url + "/version", timeout=30).json().get("engine_config") or {}
    order = segment_order(variant["context_first"])
    sampler = RequestSampler(profile, int(card.get("vocab_size") or 32000), order, seed)
    if sampler.max_request_tokens() > int(card["max_model_len"]):
        raise SystemExit(f"the longest request ({sampler.max_request_tokens()} tokens) exceeds the server's "
                         f"max_model_len {card['max_model_len']}")
    reference = asyncio.run(idle_reference(base_url, card["id"], sampler, seed))
    started = time.time()
    result = asyncio.run(run_load(base_urls, card["id"], sampler, shape))
    window = (shape.warmup_s, shape.warmup_s + shape.duration_s)
    summary = latency_summary(result.records, shape.duration_s)
    summary |= system_prompt_hits(result.records, int(engine_config.get("block_size", 16)))
    summary["num_unfinished"] = result.num_unfinished
    summary["engine"] = engine_summary(result.metrics_start, result.metrics_end, result.timeseries, window,
                                       len(result.records))
    return {"started_unix": started, "model": card, "engine_config": engine_config, "prompt_order": list(order),
            "prompt_builder": builder_name(),
            "load": dataclasses.asdict(shape), "idle_reference": reference, "summary": summary,
            "timeseries": result.timeseries,
            "requests": [{"kind": r.kind, "user": r.user, "start_s": round(r.start_s, 3),
                          "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                          "output_tokens": r.output_tokens, "ttft_ms": round(1000 * r.ttft_s, 2),
                          "e2el_ms": round(1000 * r.e2el_s, 2), "error": r.error} for r in result.records]}


def print_block(label: str, s: dict, targets: dict, reference: dict) -> None:
    e = s["engine"]
    print(f"==== {label}: {s['completed']}/{s['num_requests']} requests, {s['request_throughput']:.2f} req/s, "
          f"{s['output_throughput']:.1f} output tok/s")
    for name in ("ttft", "itl", "tpot", "e2el"):
        print(f"  {name.upper():5} ms  median {s[f'median_{name}_ms']:9.1f}  p95 {s[f'p95_{name}_ms']:9.1f}  "
              f"p99 {s[f'p99_{name}_ms']:9.1f}")
    print(f"  system-prompt hit rate {s['system_prompt_hit_rate']:.1%}, engine prefix hit rate "
          f"{e['prefix_cache_hit_rate']:.1%}, prefill tokens/request {e['prefill_tokens_computed_per_request']:.0f}, "
          f"waiting mean/max {e['mean_num_requests_waiting']:.1f}/{e['max_num_requests_waiting']:.0f}, "
          f"KV usage max {e['max_kv_cache_usage_perc']:.0%}, preemptions {e['num_preemptions']:.0f}")
    print(f"  targets {targets}: {s['targets_met']}")
    print(f"  idle reference (one request alone): {reference}")


def main(argv=None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.profile, args.workload)
    if args.users:
        profile = dataclasses.replace(profile, users=args.users)
    if args.think_time_mean_s:
        profile = dataclasses.replace(profile, think_time_mean_s=args.think_time_mean_s)
    variant = load_variant(args.variant, args.profile, args.workload)
    shape = LoadShape(users=profile.users, think_time_mean_s=profile.think_time_mean_s,
                      warmup_s=args.warmup_s if args.warmup_s is not None else profile.warmup_s,
                      duration_s=args.duration_s or profile.duration_s, drain_s=args.drain_s, seed=args.seed)
    sweep = [int(u) for u in args.sweep_users.split(",")] if args.sweep_users else None
    out = args.out or CASE_DIR / args.variant / (f"sweep_{args.profile}.json" if sweep else
                                                 f"results_{args.profile}.json")
    serve_args = split_serve_args(args.serve_arg)
    replicas = args.replicas or variant.get("replicas", 1)
    servers: list[EngineServer] = []
    if args.base_url:
        base_urls = [u.rstrip("/") for u in args.base_url.split(",")]
        if args.replicas and args.replicas != len(base_urls):
            raise SystemExit(f"--replicas {args.replicas} but --base-url names {len(base_urls)} servers")
        check_same_config(base_urls)
    else:
        if replicas > 1 and len(visible_gpus()) < replicas:
            raise SystemExit(f"{replicas} replicas need {replicas} GPUs (one each); this machine shows "
                             f"{len(visible_gpus())} (pass --replicas to change the count)")
        try:  # one server per GPU, started together; replica i logs to <out>.server[i].log
            for i in range(replicas):
                log = out.with_suffix(".server.log" if i == 0 else f".server{i}.log")
                servers.append(EngineServer(variant["config"], profile.engine, serve_args, log,
                                            gpu=i if replicas > 1 else None, wait=False))
            for server in servers:
                server.wait_healthy()
        except BaseException:
            for server in servers:
                server.stop()
            raise
        base_urls = [server.url for server in servers]
    server = servers[0] if servers else None
    try:
        runs = []
        for users in sweep or [profile.users]:
            point = dataclasses.replace(shape, users=users)
            run = measure(base_urls, profile, variant, point, args.seed)
            run["summary"]["targets_met"] = check_targets(run["summary"], profile.targets)
            if server is not None:  # replica 0's lines; every replica's below when there are several
                run["engine_log_stats_lines"] = server.log_lines("Avg prompt throughput")[-40:]
                run["engine_step_time_lines"] = server.log_lines("Step time:")[-40:]
            if len(servers) > 1:
                run["replica_log_lines"] = [{"stats": s.log_lines("Avg prompt throughput")[-40:],
                                             "step_time": s.log_lines("Step time:")[-40:]} for s in servers]
            print_block(f"{args.variant} / {args.profile} / {users} users", run["summary"], profile.targets,
                        run["idle_reference"])
            runs.append(run)
    finally:
        for replica in servers:
            replica.stop()
    from benchmarks.env_info import environment  # after the server stopped: torch may touch the GPU

    record = {
        "case": "rag_chatbot", "profile": args.profile, "variant": args.variant,
        "command": "python " + " ".join([str(Path(sys.argv[0]))] + sys.argv[1:]),
        "server_command": server.command if server else f"(running servers at {', '.join(base_urls)})",
        "replicas": len(base_urls),
        "server_commands": [replica.command for replica in servers],
        **environment(),
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM")},
        "config_file": str(variant["config"].relative_to(CASE_DIR)),
        "config_yaml": variant["config"].read_text(), "context_first": variant["context_first"],
        # with --base-url the variant's config was not applied here: `engine_config` is what the server runs
        "config_applied_by_this_run": server is not None,
        "profile_engine_flags": profile.engine, "serve_args": serve_args,
        "workload": dataclasses.asdict(profile), "targets": profile.targets,
    }
    if os.environ.get("GIT_COMMIT"):  # a device copy may carry a stale .git: the caller's commit wins
        record["commit_from_git"], record["commit"] = record["commit"], os.environ["GIT_COMMIT"]
    if sweep:
        best = [r for r in runs if r["summary"]["targets_met"]["all"]]
        record["sweep_users"] = sweep
        record["highest_sustained"] = max(
            ({"users": r["load"]["users"], "request_throughput": r["summary"]["request_throughput"]} for r in best),
            key=lambda x: x["request_throughput"], default=None)
        record["runs"] = runs
    else:
        record |= runs[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
