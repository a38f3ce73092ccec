"""The case's load test on one H200 in about six minutes (h200_quick.sh runs it): two engine starts, three
measured phases, the asyncio users (async_users.py; the device has no locust).

    python case_multilora/loadtest/h200_quick.py --adapters-dir /tmp/multilora_adapters \
        --tokenizer /tmp/wide_tokenizer [--phase-s 60]

1. The fix's engine (the_fix/config_h200.yaml: 32 slots, fair, llama-3.1-8b dummy, 30 random adapters) and
   a gateway with the limits; a warm-up (every tenant once, then `--warmup-s` of the full load through a
   gateway without limits, so the whales' quota windows start empty); then **isolated** (the 28 well-behaved
   tenants alone, `--phase-s`) and **the fix** (the same plus the two whales bursting at 10x their quota)
   on that engine: `the_fix/isolated_h200q.json`, `the_fix/results_h200q.json`.
2. The first attempt's engine (first_attempt/config_h200.yaml: `max_loras` 1, FCFS) with a gateway without
   limits, the same warm-up and the whales' load: `first_attempt/results_h200q.json`.
Then `report.py --profile h200q`. Engine metrics in each file are the phase's own (after minus before).
No base-model phase: the LoRA throughput against the base at equal work is bench_lora's
(benchmarks/results/lora_h200_llama8b_284c523.json); this run's tokens/s are at the offered load.
`--model`/`--dtype` replace the configs' (a CPU smoke run: `--model smollm2-135m --dtype auto`, adapters
made with `scripts/make_adapters.py random --model smollm2-135m`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from case_multilora.loadtest.async_users import QUESTIONS, LoadShape, run  # noqa: E402
from case_multilora.loadtest.run_loadtest import PROFILES, engine_metrics, summarise, tenants_files  # noqa: E402
from case_multilora.services import start_engine, start_gateway  # noqa: E402

PROFILE = "h200q"


def phase(gateway_url: str, engine_url: str, tenants_json: Path, shape: LoadShape, work: Path, name: str) -> dict:
    """One measured phase: the users for `shape.duration_s`, the samples, the summary, the engine's metric deltas."""
    samples = work / f"samples-{name}.jsonl"
    before, load_before = engine_metrics(engine_url), list(os.getloadavg())
    started = time.monotonic()
    asyncio.run(run(gateway_url, json.loads(tenants_json.read_text()), shape, samples))
    elapsed = time.monotonic() - started
    after = engine_metrics(engine_url)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return {"load_average_before": load_before, "elapsed_s": round(elapsed, 1),
            "summary": summarise(rows, shape.duration_s),
            "engine_metrics": {k: round(after[k] - before.get(k, 0.0), 3) for k in after}, "samples": rows}


def warm_up(engine_url: str, work: Path, profile: dict, shape: LoadShape, warmup_s: float) -> None:
    """Every tenant's adapter once (all at once, short questions), then `warmup_s` of the full load, through a
    gateway without limits (so no quota window of the measured gateway is touched). Samples discarded."""
    tenants_yaml, tenants_json = tenants_files(work / "warmup", profile, limits=False, base_model=None)
    gateway = start_gateway(work / "warmup", engine_url, tenants_yaml)
    try:
        spec = json.loads(tenants_json.read_text())

        async def one(client: httpx.AsyncClient, i: int, tenant: dict) -> None:
            r = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {tenant['key']}"},
                                  json={"messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]}"}],
                                        "max_tokens": 8})
            if r.status_code != 200:
                raise RuntimeError(f"warm-up request for {tenant['name']}: {r.status_code} {r.text[:300]}")

        async def once() -> None:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=300) as client:
                await asyncio.gather(*(one(client, i, t) for i, t in enumerate(spec["well_behaved"] + spec["whales"])))

        asyncio.run(once())
        if warmup_s > 0:
            asyncio.run(run(gateway.url, spec, LoadShape(**{**shape.__dict__, "duration_s": warmup_s}),
                            work / "warmup" / "samples.jsonl"))
    finally:
        gateway.stop()


def record(variant: str, config: dict, adapters: dict, tenants_yaml: Path, profile: dict, shape: LoadShape,
           measured: dict, out: Path, command: str) -> None:
    result = {"variant": variant, "command": command, "environment": environment(), "http_stack": http_stack(),
              "load_average_before": measured["load_average_before"], "engine_config": config,
              "adapters": {n: p.name for n, p in adapters.items()},
              "tenants": yaml.safe_load(tenants_yaml.read_text())["tenants"], "profile": PROFILE,
              "load": {**{k: v for k, v in profile.items() if k != "configs"}, **shape.__dict__,
                       "driver": "async_users.py"},
              **{k: measured[k] for k in ("elapsed_s", "summary", "engine_metrics", "samples")}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    s = measured["summary"]["well-behaved"]
    print(f"[{variant}] well-behaved p99 TTFT {s['p99_ttft_ms']} ms, median {s['median_ttft_ms']} ms, "
          f"{s['statuses']}; whales {measured['summary']['whale']['statuses']}; wrote {out}", flush=True)


def http_stack() -> dict:
    """What uvicorn runs the engine's server and the gateway on (its `auto` picks uvloop and httptools where
    importable; without them asyncio's own loop and h11 cost each SSE chunk more: http_path_bench.py)."""
    from importlib.util import find_spec

    return {"uvloop": find_spec("uvloop") is not None, "httptools": find_spec("httptools") is not None}


def engine_config(name: str, model: str | None, dtype: str | None, tokenizer: Path, sets: list[str]) -> dict:
    """The profile's engine config with the wide tokenizer, `model`/`dtype` if given and KEY=VALUE overrides
    (values as YAML)."""
    config = yaml.safe_load((CASE_DIR / PROFILES["h200"]["configs"][name]).read_text())
    config["tokenizer"] = str(tokenizer.resolve())
    for item in sets:
        key, _, value = item.partition("=")
        config[key] = yaml.safe_load(value)
    if model:
        config["model"] = model
    if dtype:
        config["dtype"] = dtype
    return config


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapters-dir", type=Path, required=True, help="scripts/make_adapters.py random --ranks 8 16 64 "
                   "--count 10 --out DIR")
    p.add_argument("--tokenizer", type=Path, required=True, help="wide_tokenizer.py's output")
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--engine-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an engine config key in both configs (e.g. max_num_batched_tokens=512)")
    p.add_argument("--phase-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=10.0)
    p.add_argument("--well-behaved-users", type=int, default=48)
    p.add_argument("--whale-users", type=int, default=8, help="per whale")
    p.add_argument("--pacing-s", type=float, default=4.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--whale-max-tokens", type=int, default=256)
    p.add_argument("--quota", type=int, default=120, help="whales' requests per minute (they send 10x)")
    p.add_argument("--burst-period-s", type=float, default=20.0)
    p.add_argument("--whale-process", action="store_true",
                   help="the whales' users in a process (event loop, HTTP client) of their own: their streams do "
                   "not delay the well-behaved users' first-token timestamps (async_users.run)")
    p.add_argument("--out-dir", type=Path, default=CASE_DIR)
    p.add_argument("--work-dir", type=Path, default=None, help="engine/gateway logs, samples (default: a temp dir)")
    args = p.parse_args(argv)
    for path in (args.adapters_dir, args.tokenizer):
        if not path.is_dir():
            p.error(f"{path} is not a directory")
    command = "python case_multilora/loadtest/h200_quick.py " + " ".join(argv if argv is not None else sys.argv[1:])
    profile = {**PROFILES["h200"], "well_behaved_users": args.well_behaved_users, "whale_users": args.whale_users,
               "pacing_s": args.pacing_s, "max_tokens": args.max_tokens, "whale_max_tokens": args.whale_max_tokens,
               "quota": args.quota}
    shape = LoadShape(args.phase_s, args.well_behaved_users, args.whale_users, args.pacing_s, args.max_tokens,
                      args.whale_max_tokens, args.burst_period_s, ignore_eos=True, whale_process=args.whale_process)
    alone = LoadShape(**{**shape.__dict__, "whale_users": 0})
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="multilora-h200q-"))
    for name in ("fix", "first", "warmup"):
        (work / name).mkdir(parents=True, exist_ok=True)
    print(f"http stack (uvicorn auto): {http_stack()}", flush=True)
    started = time.monotonic()
    for engine_name, variants in (("the_fix", ("isolated", "the_fix")), ("first_attempt", ("first_attempt",))):
        config = engine_config(engine_name, args.model, args.dtype, args.tokenizer, args.engine_set)
        adapters = {m.split("=")[0]: args.adapters_dir / Path(m.split("=")[1]).name for m in config["lora_modules"]}
        sub = work / ("fix" if engine_name == "the_fix" else "first")
        (sub / "engine.yaml").write_text(yaml.safe_dump(config))
        t0 = time.monotonic()
        engine = start_engine(sub, sub / "engine.yaml", adapters)
        print(f"[{engine_name}] engine up in {time.monotonic() - t0:.0f} s", flush=True)
        gateway = None
        try:
            warm_up(engine.url, work, profile, shape, args.warmup_s)
            limits = engine_name == "the_fix"
            tenants_yaml, tenants_json = tenants_files(sub, profile, limits, base_model=None)
            gateway = start_gateway(sub, engine.url, tenants_yaml)
            for variant in variants:
                measured = phase(gateway.url, engine.url, tenants_json, alone if variant == "isolated" else shape,
                                 sub, variant)
                out = args.out_dir / {"isolated": "the_fix/isolated_{p}.json", "the_fix": "the_fix/results_{p}.json",
                                      "first_attempt": "first_attempt/results_{p}.json"}[variant].format(p=PROFILE)
                record(variant, config, adapters, tenants_yaml, profile, alone if variant == "isolated" else shape,
                       measured, out, command)
        finally:
            if gateway:
                gateway.stop()
            engine.stop()
    print(f"all phases in {time.monotonic() - started:.0f} s (logs under {work})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
