"""The case's load test on this machine: engine + gateway started per variant, locust (locustfile.py) with Zipf
well-behaved tenants and two bursting whales, one results file per variant.

    python case_multilora/loadtest/run_loadtest.py --variant isolated        # well-behaved tenants alone
    python case_multilora/loadtest/run_loadtest.py --variant first_attempt   # max_loras 1, FCFS, no limits
    python case_multilora/loadtest/run_loadtest.py --variant the_fix         # 4 slots, fair, gateway limits
    python case_multilora/loadtest/run_loadtest.py --variant base            # the fix's load, base model only
    python case_multilora/loadtest/report.py                                 # the comparison + plots

Scaled down for a 2-core CPU: 6 well-behaved tenants (adapters acme, json, french, upper in turn) shared by 4
locust users, each pacing one 16-token answer every 8 s, tenant by true Zipf (s 1.1); 2 whales (french, upper
adapters; quota 12 requests/minute) with 4 users each sending ~330-token documents for 32-token summaries at
10x the quota during the first half of every 30 s. `base` runs the fix's engine without LoRA and points every
tenant at the base model (the throughput reference at equal offered load). Results:
`first_attempt/results_cpu.json`, `the_fix/results_cpu.json`, `the_fix/isolated_cpu.json`,
`the_fix/base_cpu.json` (hardware and load average, commit, command, configs, every figure).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

HERE = Path(__file__).resolve().parent
CASE_DIR = HERE.parent
REPO = CASE_DIR.parent
sys.path.insert(0, str(REPO))

from benchmarks.env_info import environment  # noqa: E402
from case_multilora.adapters import ensure_adapters  # noqa: E402
from case_multilora.services import start_engine, start_gateway  # noqa: E402

# profile: tenants (name, adapter) in popularity order, whales, users, answer lengths, the configs
PROFILES = {
    "cpu": {"well_behaved": [("t1", "acme"), ("t2", "json"), ("t3", "french"), ("t4", "upper"), ("t5", "acme"),
                             ("t6", "json")],
            "whales": [("w1", "french"), ("w2", "upper")], "well_behaved_users": 4, "whale_users": 4,
            "pacing_s": 8.0, "max_tokens": 16, "whale_max_tokens": 32, "quota": 12,
            "configs": {"first_attempt": "first_attempt/config.yaml", "the_fix": "config.yaml"}},
    # the brief's 30 tenants on the H200: 28 well-behaved + 2 whales over 30 random adapters (t<rank>-<i>)
    "h200": {"well_behaved": [(f"t{i + 1}", f"t{(8, 16, 64)[i % 3]}-{i // 3}") for i in range(28)],
             "whales": [("w1", "t16-9"), ("w2", "t64-9")], "well_behaved_users": 96, "whale_users": 32,
             "pacing_s": 2.0, "max_tokens": 128, "whale_max_tokens": 256, "quota": 120, "ignore_eos": True,
             "configs": {"first_attempt": "first_attempt/config_h200.yaml", "the_fix": "the_fix/config_h200.yaml"}},
}
VARIANTS = {  # config: which of the profile's configs; out: results file, {profile} filled in
    "isolated": {"config": "the_fix", "limits": True, "whales": False, "out": "the_fix/isolated_{profile}.json"},
    "first_attempt": {"config": "first_attempt", "limits": False, "whales": True,
                      "out": "first_attempt/results_{profile}.json"},
    "the_fix": {"config": "the_fix", "limits": True, "whales": True, "out": "the_fix/results_{profile}.json"},
    "base": {"config": "the_fix", "limits": True, "whales": True, "base": True, "out": "the_fix/base_{profile}.json"},
}
LORA_KEYS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "allowed_local_lora_path", "lora_modules")


def tenants_files(work: Path, profile: dict, limits: bool, base_model: str | None) -> tuple[Path, Path]:
    """(the gateway's tenants YAML, the locust tenants JSON). Whales: `quota` requests a minute, tokens for
    that many whale requests; well-behaved: 2.5x their pacing's rate (never limited in normal use)."""
    rows, spec = [], {"well_behaved": [], "whales": []}
    quota = profile["quota"]
    wb_rate = max(30, round(2.5 * 60 / profile["pacing_s"] * profile["well_behaved_users"]))
    for kind in ("well_behaved", "whales"):
        group = profile[kind]
        for name, adapter in group:
            key = f"sk-{name}-load"
            row = {"name": name, "api_key_sha256": hashlib.sha256(key.encode()).hexdigest(),
                   "adapter": base_model or adapter}
            if limits and kind == "whales":
                row.update(request_limit=f"{quota}/minute", token_limit=f"{quota * (400 + profile['whale_max_tokens'])}"
                           "/minute", max_concurrency=max(2, profile["whale_users"] // 2))
            elif limits:
                row.update(request_limit=f"{wb_rate}/minute", token_limit=f"{wb_rate * (64 + profile['max_tokens'])}"
                           "/minute", max_concurrency=max(4, profile["well_behaved_users"]))
            rows.append(row)
            spec[kind].append({"name": name, "key": key, "quota_per_minute": quota})
    (work / "tenants.yaml").write_text(yaml.safe_dump({"tenants": rows}))
    (work / "tenants.json").write_text(json.dumps(spec))
    return work / "tenants.yaml", work / "tenants.json"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def summarise(samples: list[dict], duration_s: float) -> dict:
    out = {}
    for kind in ("well-behaved", "whale"):
        rows = [s for s in samples if s["kind"] == kind]
        ok = [s for s in rows if s["status"] == 200 and "ttft_s" in s]
        ttft = [s["ttft_s"] * 1000 for s in ok]
        tokens = sum(s.get("completion_tokens", 0) for s in ok)
        statuses = {}
        for s in rows:
            statuses[str(s["status"])] = statuses.get(str(s["status"]), 0) + 1
        out[kind] = {"num_requests": len(rows), "statuses": statuses, "completion_tokens": tokens,
                     "output_tokens_per_s": round(tokens / duration_s, 3),
                     **{f"{n}_ttft_ms": round(percentile(ttft, q), 1) if ttft else None
                        for n, q in (("median", 50), ("p90", 90), ("p99", 99))},
                     "mean_ttft_ms": round(statistics.mean(ttft), 1) if ttft else None,
                     "p99_e2e_ms": round(percentile([s["e2e_s"] * 1000 for s in ok], 99), 1) if ok else None}
        open_ = [s for s in rows if s["status"] == "incomplete"]  # async_users.py: cut off at the run's end
        if open_:
            # every admitted request's TTFT, the cut-off ones' waits as lower bounds (a starved tail is not short)
            censored = ttft + [s["ttft_s"] * 1000 if "ttft_s" in s else s["waited_s"] * 1000 for s in open_]
            out[kind].update(num_incomplete=len(open_),
                             num_incomplete_without_first_token=sum(1 for s in open_ if "ttft_s" not in s),
                             p99_ttft_ms_censored=round(percentile(censored, 99), 1))
        if kind == "well-behaved":
            out[kind]["per_tenant_p99_ttft_ms"] = {
                t: round(percentile([s["ttft_s"] * 1000 for s in ok if s["tenant"] == t], 99), 1)
                for t in sorted({s["tenant"] for s in ok})}
            out[kind]["per_tenant_requests"] = {t: sum(1 for s in rows if s["tenant"] == t)
                                                for t in sorted({s["tenant"] for s in rows})}
    out["output_tokens_per_s"] = round(out["well-behaved"]["output_tokens_per_s"] + out["whale"]["output_tokens_per_s"],
                                       3)
    return out


def engine_metrics(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=30).text
    keep = ("vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
            "vllm:request_success_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    values: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in keep:
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    p.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    p.add_argument("--adapters-dir", type=Path, default=None,
                   help="h200: the random adapters (scripts/make_adapters.py random --ranks 8 16 64 --count 10)")
    p.add_argument("--duration-s", type=int, default=120)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--engine-config", type=Path, default=None,
                   help="instead of the profile's config for the variant (a control run; the file records it)")
    args = p.parse_args(argv)
    variant, profile = VARIANTS[args.variant], PROFILES[args.profile]
    work = Path(tempfile.mkdtemp(prefix=f"multilora-{args.variant}-"))
    config = yaml.safe_load((args.engine_config or CASE_DIR / profile["configs"][variant["config"]]).read_text())
    if variant.get("base"):
        adapters = None
    elif args.profile == "cpu":
        adapters = ensure_adapters()
    else:  # the config's names t<rank>-<i> on the directories r<rank>-<i>
        adapters = {m.split("=")[0]: args.adapters_dir / Path(m.split("=")[1]).name for m in config["lora_modules"]}
    if variant.get("base"):
        config = {k: v for k, v in config.items() if k not in LORA_KEYS}
    (work / "engine.yaml").write_text(yaml.safe_dump(config))
    engine = start_engine(work, work / "engine.yaml", adapters)
    gateway = None
    try:
        base_model = None
        if variant.get("base"):
            base_model = httpx.get(engine.url + "/v1/models", timeout=30,
                                   headers={"Authorization": "Bearer sk-engine-local"}).json()["data"][0]["id"]
        tenants_yaml, tenants_json = tenants_files(work, profile, variant["limits"], base_model)
        gateway = start_gateway(work, engine.url, tenants_yaml)
        whales = len(profile["whales"]) * profile["whale_users"] if variant["whales"] else 0
        samples = work / "samples.jsonl"
        classes = ["WellBehaved", "Whale"] if whales else ["WellBehaved"]  # fixed_count 0 would mean "by weight"
        cmd = [sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), *classes, "--headless",
               "-u", str(profile["well_behaved_users"] + whales), "-r", "100", "-t", f"{args.duration_s}s",
               "--host", gateway.url, "--ml-tenants", str(tenants_json), "--ml-samples", str(samples),
               "--ml-whale-users", str(profile["whale_users"]), "--ml-pacing-s", str(profile["pacing_s"]),
               "--ml-max-tokens", str(profile["max_tokens"]), "--ml-whale-max-tokens", str(profile["whale_max_tokens"]),
               "--csv", str(work / "locust"), "--only-summary", "--stop-timeout", "30",
               *(["--ml-ignore-eos"] if profile.get("ignore_eos") else [])]
        load_before = list(os.getloadavg())
        started = time.monotonic()
        run = subprocess.run(cmd, env={**os.environ, "ML_WHALE_USERS_TOTAL": str(whales)}, capture_output=True,
                             text=True, timeout=args.duration_s + 300)
        elapsed = time.monotonic() - started
        if run.returncode not in (0, 1):  # 1: some request failed (counted in the samples)
            raise SystemExit(f"locust failed ({run.returncode}):\n{run.stderr[-3000:]}")
        rows = [json.loads(line) for line in samples.read_text().splitlines()]
        result = {
            "variant": args.variant, "command": "python " + " ".join([str(Path(sys.argv[0]).relative_to(REPO))
                                                                       if Path(sys.argv[0]).is_absolute()
                                                                       else sys.argv[0], *sys.argv[1:]]),
            "environment": environment(), "load_average_before": load_before, "engine_config": config,
            "adapters": {n: str(p.name) for n, p in (adapters or {}).items()},
            "tenants": yaml.safe_load(tenants_yaml.read_text())["tenants"],
            "profile": args.profile,
            "load": {"duration_s": args.duration_s, "zipf_s": 1.1, "burst_period_s": 30.0,
                     **{k: v for k, v in profile.items() if k != "configs"},
                     "whale_users": profile["whale_users"] if variant["whales"] else 0},
            "elapsed_s": round(elapsed, 1), "summary": summarise(rows, args.duration_s),
            "engine_metrics": engine_metrics(engine.url), "samples": rows}
        out = args.out or CASE_DIR / variant["out"].format(profile=args.profile)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["summary"], indent=2))
        print("wrote", out)
    finally:
        if gateway:
            gateway.stop()
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
