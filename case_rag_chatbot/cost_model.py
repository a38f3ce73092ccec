"""Capacity and cost of the RAG chatbot on H200, H100 and L4, at the brief's 200 users and at 10x: modelled, not
measured (no GPU needed; `shared_engine.sim` runs the engine's own scheduler in simulated time).

    python case_rag_chatbot/cost_model.py --json case_rag_chatbot/cost_model.json

Workload: `workload.yaml`'s `h200` profile (closed-loop users, exponential think time, the 4,096-token shared
system prompt, 4 retrieved chunks or a pasted document, answers of 128-384 tokens); engine: the fix
(`the_fix/config.yaml`) with llama-3.1-8b in bf16 and the profile's max_model_len, on the whole device (the
profile's KV cap is a test device for the measured runs, not part of the deployment). SLO: the brief's p95 TTFT
<= 800 ms and p95 ITL <= 25 ms.

Method, per GPU: replicas are independent (users are routed at random, so each replica sees users/replicas
of them), so the question is how many users one replica holds within the SLO. A first check is the decode
floor: one decode step reads all the weights, so if a single-sequence step already exceeds the ITL target no
number of replicas meets it (the GPU is then sized for the TTFT target alone, and says so). Then up to
`--probes` simulations of one replica (4 requests per user) bracket the capacity: a probe that fails sets the
next guess from the throughput it saturated at (capacity ~ throughput x (think + response time)), one that
passes steps up 25 %. Replicas = ceil(users / highest passing users per replica); $ per 1M tokens = fleet
$/hour / tokens per hour, with the tokens per hour of the users at their simulated response time.
GPU prices are dated inputs (the hardware profiles', or `--price GPU=USD`).

Step times: each GPU's datasheet peaks with the achieved fractions and the device and host overheads fitted
to llama-3.1-8b's recorded H200 step profile (`hardware_for`), under the `phases` rule (GEMMs and attention
each bounded by memory or compute, one after the other: shared_engine/sim/step_time.py), host and device
work one after the other (the synchronous step; conservative under async scheduling).

Measured margin: against the fix's measured H200 serving runs (scripts/sim_fidelity_gpu.py, "serving": one
replica at 200 users, two replicas at 200 / 250 / 300 users; benchmarks/results/sim_fidelity_h200.json)
the model predicts request throughput within 8% but under-predicts p95 ITL by 10-17% and, below
saturation, p95 TTFT by 31-36% (the served path adds HTTP, tokenisation and the API process, which the
simulator does not run). So each GPU is sized against the SLO shrunk by the worst of those errors
(`model_margin`: p95 TTFT <= 509 ms, p95 ITL <= 20.7 ms in the model); `--no-margin` sizes against the SLO
itself. The margin is a share of the target, measured on the H200 only: the other GPUs inherit it (on the
H200 the gaps were nearly constant, ~4 ms of p95 ITL and 100-180 ms of p95 TTFT, so a slower GPU's longer
steps probably need less than the share says). Sized so, one H200 holds 137 users (140 fail), where the
measured sweep held 125 a replica and missed at 150; without the margin the model gives 178 (181 fail;
`--no-margin`), and with one request per user instead of four it gave more still.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

CASE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(CASE_DIR.parent))

from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.sim import Simulator, WorkloadSpec, load_hardware  # noqa: E402
from shared_engine.sim.calibration import calibrated  # noqa: E402
from shared_engine.sim.hardware import HardwareProfile  # noqa: E402
from shared_engine.sim.model_shape import resolve_arch  # noqa: E402

MODEL = "llama-3.1-8b"
GPUS = ("h200", "h100-sxm", "l4")
# The L4 profile carries no price: a dated input, AWS g6.xlarge on-demand (1x L4), as quoted by
# citadelcloudmanagement.com "GPU Infrastructure for AI Workloads: Cloud vs On-Prem Cost Analysis 2026".
DEFAULT_PRICES = {"l4": (0.805, "2026", "AWS g6.xlarge (1x L4) on-demand, quoted by citadelcloudmanagement.com (2026)")}


def load_case() -> tuple[dict, dict]:
    """(the h200 profile of workload.yaml, the fix's engine settings)."""
    profile = yaml.safe_load((CASE_DIR / "workload.yaml").read_text())["profiles"]["h200"]
    fix = yaml.safe_load((CASE_DIR / "the_fix" / "config.yaml").read_text()) or {}
    return profile, fix


def workload_spec(profile: dict, users: int, num_requests: int) -> WorkloadSpec:
    """The profile as a simulator workload: the request's own tokens are a RAG turn (4 chunks + question) or,
    with `document_share`, a document turn; both after the shared system prompt."""
    q = (profile["question_tokens"]["min"] + profile["question_tokens"]["max"]) / 2
    rag = profile["context"]["chunks"] * profile["context"]["chunk_tokens"] + q
    doc = (profile["document_tokens"]["min"] + profile["document_tokens"]["max"]) / 2 + q
    share = profile["document_share"]
    return WorkloadSpec.from_dict({
        "name": f"rag-chatbot {users} users", "seed": 0, "num_requests": num_requests,
        "arrival": {"process": "closed_loop", "num_users": users, "think_time_s": profile["think_time_s"]},
        "prompt_len": {"dist": "choice", "values": [round(rag), round(doc)], "weights": [1 - share, share]},
        "output_len": {"dist": "uniform", **profile["answer_tokens"]},
        "prefix": {"system_prompt_len": profile["system_prompt_tokens"]},
        "slo": {"p95_ttft_ms": profile["targets"]["p95_ttft_ms"], "p95_itl_ms": profile["targets"]["p95_itl_ms"]},
    })


def probe(sim: Simulator, profile: dict, users: int) -> dict:
    # REQUESTS_PER_USER turns per user. Closed-loop users start after an exponential think time (memoryless:
    # a thinking user's steady state), but with a single turn each the arrival rate only decays from
    # users / think: at 187 users on one H200, one turn each gave p95 TTFT 576 ms, five turns 1.1 s.
    spec = workload_spec(profile, users, REQUESTS_PER_USER * users)
    s = sim.run_replicas(spec, 1).summary()
    keep = ("request_throughput", "output_throughput", "total_token_throughput", "p95_ttft_ms", "p95_itl_ms",
            "median_itl_ms", "mean_e2el_ms", "prefix_cache_hit_rate", "num_preemptions", "kv_cache_usage_max")
    return {"users": users, "num_requests": spec.num_requests, **{k: s[k] for k in keep}}


def meets(result: dict, slo: dict, itl_feasible: bool) -> bool:
    ok = result["p95_ttft_ms"] <= slo["p95_ttft_ms"]
    return ok and (not itl_feasible or result["p95_itl_ms"] <= slo["p95_itl_ms"])


def search(sim: Simulator, profile: dict, slo: dict, itl_required: bool, start: int, num_probes: int,
           floor_ms: float, known: dict | None = None) -> tuple[int | None, int | None, list[dict]]:
    """(most users that met `slo`, fewest that failed, the probes): up 25 % after a pass (100 % when TTFT was
    under half its target), bisection once
    bracketed, and after a failure with nothing passed yet, the users its saturated throughput would carry
    (closed loop: users = throughput x (think + response time)), at least a quarter fewer. `known`: earlier
    probes by users, reused instead of simulated again."""
    think = profile["think_time_s"]["mean"]
    mean_answer = (profile["answer_tokens"]["min"] + profile["answer_tokens"]["max"]) / 2
    probes, best, worst, guess = [], None, None, start
    for _ in range(num_probes):
        result = dict((known or {}).get(guess) or probe(sim, profile, guess))
        result["meets_slo"] = meets(result, slo, itl_required)
        probes.append(result)
        if result["meets_slo"]:
            best = max(best or 0, guess)
        else:
            worst = min(worst or math.inf, guess)
        if best and worst:
            if worst - best <= max(1, BRACKET * best):  # bracketed closer than the model's own noise
                break
            nxt = (best + worst) // 2
        elif best:  # far inside the SLO: double; near it: 25 % more
            far = result["p95_ttft_ms"] < slo["p95_ttft_ms"] / 2
            nxt = int(best * (2.0 if far else 1.25))
        else:
            allowed_s = (slo["p95_ttft_ms"] + mean_answer * max(floor_ms, result["median_itl_ms"])) / 1000
            nxt = max(1, min(int(0.75 * guess), int(0.9 * result["request_throughput"] * (think + allowed_s))))
        if nxt in (best, worst, guess):
            break
        guess = nxt
    return best, worst, probes


FIDELITY = CASE_DIR.parent / "benchmarks" / "results" / "sim_fidelity_h200.json"
REQUESTS_PER_USER = 4
# Capacity is bracketed to 3% (passing and failing users): 4 turns per user leave the simulated p95 ITL
# noisy at about that scale (137 users passed and 138 failed on one H200).
BRACKET = 0.03


def model_margin(path: Path = FIDELITY) -> dict:
    """How far the model under-predicted each SLO percentile on the measured H200 serving runs of this case
    with async scheduling (scripts/sim_fidelity_gpu.py's "serving"; the worst run, as a fraction <= 0):
    the model is sized against target * (1 + margin), so that the measured percentile meets the target.
    Returns {"p95_ttft_ms": m, "p95_itl_ms": m, "runs": [...], "source": ...}; margins 0 without the file."""
    keys = ("p95_ttft_ms", "p95_itl_ms")
    if not path.exists():
        return {**{k: 0.0 for k in keys}, "runs": [], "source": f"{path.name} missing: no margin"}
    serving = json.loads(path.read_text()).get("serving", {})
    runs = {name: r for name, r in serving.items() if r["measured"].get("async_scheduling")}
    margin = {k: min([0.0] + [r["error_pct"][k] / 100.0 for r in runs.values()]) for k in keys}
    source = path.relative_to(CASE_DIR.parent) if path.is_relative_to(CASE_DIR.parent) else path
    return {**margin, "runs": sorted(runs), "source": str(source)}


def sizing_slo(slo: dict, margin: dict) -> dict:
    """The SLO the model must meet so that the measured one is met (`model_margin`)."""
    return {k: v * (1.0 + margin.get(k, 0.0)) for k, v in slo.items()}


STEP_PROFILE = CASE_DIR.parent / "shared_engine" / "sim" / "step_profiles" / "h200_llama-3.1-8b.json"


def hardware_for(gpu: str) -> HardwareProfile:
    """`gpu`'s datasheet profile with the fractions and overheads fitted to the H200 llama-3.1-8b step profile
    (the case's model); other GPUs are assumed to reach the same shares of their peaks."""
    fit = calibrated(load_hardware("h200"), STEP_PROFILE)
    return dataclasses.replace(
        load_hardware(gpu), bandwidth_fraction=fit.bandwidth_fraction, matmul_fraction=fit.matmul_fraction,
        attention_fraction=fit.attention_fraction, step_overhead_s=fit.step_overhead_s,
        per_seq_overhead_s=fit.per_seq_overhead_s, device_step_overhead_s=fit.device_step_overhead_s,
        device_per_seq_overhead_s=fit.device_per_seq_overhead_s, fraction_source=f"H200 {fit.fraction_source}",
        overhead_source=f"H200 {fit.overhead_source}")


def size_gpu(gpu: str, num_probes: int, prices: dict, margin: dict | None = None) -> dict:
    """Capacity per replica, replicas and $ per 1M tokens for one GPU type at 1x and 10x users. A GPU that
    meets the brief's SLO at no load is sized again for a relaxed one (TTFT x 4, no ITL bound), and says so.
    `margin` (`model_margin`): the model is held to the SLO shrunk by what it under-predicted when measured."""
    margin = margin or {}
    profile, fix = load_case()
    _, arch = resolve_arch(MODEL)
    hardware = hardware_for(gpu)
    if hardware.price_usd_per_hour is None and gpu in prices:
        usd, date, source = prices[gpu]
        hardware = dataclasses.replace(hardware, price_usd_per_hour=usd, price_date=date, price_source=source)
    config = EngineConfig.from_flat(model=MODEL, max_model_len=profile["engine"]["max_model_len"], **fix)
    sim = Simulator(config, arch, hardware)
    brief = {"p95_ttft_ms": profile["targets"]["p95_ttft_ms"], "p95_itl_ms": profile["targets"]["p95_itl_ms"]}
    slo = sizing_slo(brief, margin)
    context = profile["system_prompt_tokens"] + profile["context"]["chunks"] * profile["context"]["chunk_tokens"]
    floor_ms = 1000 * sim.step_model.decode_floor_seconds(1, context)
    itl_feasible = floor_ms <= brief["p95_itl_ms"]
    # First guess: the brief's users, or on a GPU with less than half the H200's memory bandwidth, that many
    # scaled by the bandwidth ratio (decode steps are bandwidth-bound).
    ratio = hardware.memory_bandwidth / load_hardware("h200").memory_bandwidth
    start = profile["users"] if ratio >= 0.5 else max(1, round(profile["users"] * ratio))
    best, worst, probes = (search(sim, profile, slo, True, start, num_probes, floor_ms) if itl_feasible
                           else (None, None, []))  # out of reach: go straight to the relaxed sizing
    out = {"gpu": hardware.name, "price_usd_per_hour": hardware.price_usd_per_hour,
           "price_date": hardware.price_date, "price_source": hardware.price_source,
           "decode_floor_ms": floor_ms, "itl_target_feasible": itl_feasible, "meets_brief_slo": best is not None,
           "slo_used": brief, "model_slo": slo, "probes": probes}
    if best is None or not itl_feasible:
        relaxed = sizing_slo({"p95_ttft_ms": 4 * brief["p95_ttft_ms"]}, margin)
        passing = [p["users"] for p in probes if meets(p, relaxed, False)]
        start = max(passing) if passing else min([p["users"] for p in probes] or [start])
        best, worst, more = search(sim, profile, relaxed, False, start, num_probes, floor_ms,
                                   {p["users"]: p for p in probes})
        out |= {"meets_brief_slo": False, "slo_used": {"p95_ttft_ms": 4 * brief["p95_ttft_ms"]},
                "model_slo": relaxed, "probes": probes + more}
        if best is None:
            return out | {"error": f"no probe met even {relaxed} (down to {min(p['users'] for p in more)} users)"}
    at_best = next(p for p in out["probes"] if p["users"] == best and p["meets_slo"])
    return out | {"users_per_replica": best, "first_failing_users": worst, "at_capacity": at_best,
                  "scales": {label: fleet(users, best, at_best, profile, hardware.price_usd_per_hour)
                             for label, users in (("1x", profile["users"]), ("10x", 10 * profile["users"]))}}


def fleet(users: int, per_replica: int, at_capacity: dict, profile: dict, price: float | None) -> dict:
    """Replicas for `users`, and the fleet's $ per 1M tokens at their request rate (users / (think + E2E))."""
    replicas = math.ceil(users / per_replica)
    rate = users / (profile["think_time_s"]["mean"] + at_capacity["mean_e2el_ms"] / 1000)
    per_request = at_capacity["output_throughput"] / max(at_capacity["request_throughput"], 1e-9)
    total_per_request = at_capacity["total_token_throughput"] / max(at_capacity["request_throughput"], 1e-9)
    out = {"users": users, "replicas": replicas, "request_rate": rate,
           "output_tokens_per_hour": rate * per_request * 3600}
    if price is None:
        return out | {"fleet_usd_per_hour": None, "usd_per_1m_output_tokens": None, "usd_per_1m_total_tokens": None}
    usd = price * replicas
    return out | {"fleet_usd_per_hour": usd,
                  "usd_per_1m_output_tokens": usd / (rate * per_request * 3600 / 1e6),
                  "usd_per_1m_total_tokens": usd / (rate * total_per_request * 3600 / 1e6)}


def budget_sweep(gpu: str, budgets: list[int]) -> list[dict]:
    """The fix's config at the brief's users on one replica, with each `max_num_batched_tokens`: what sizes
    the budget (a bigger chunk makes every step that carries one longer, and every decode waits for it)."""
    profile, fix = load_case()
    _, arch = resolve_arch(MODEL)
    out = []
    for budget in budgets:
        config = EngineConfig.from_flat(model=MODEL, max_model_len=profile["engine"]["max_model_len"],
                                        **{**fix, "max_num_batched_tokens": budget})
        result = probe(Simulator(config, arch, hardware_for(gpu)), profile, profile["users"])
        out.append({"gpu": gpu, "max_num_batched_tokens": budget, **result})
    return out


def table(report: dict) -> str:
    lines = [f"RAG chatbot capacity (modelled, not measured): {MODEL} bf16, the fix's engine config, "
             f"SLO p95 TTFT <= {report['slo']['p95_ttft_ms']} ms, p95 ITL <= {report['slo']['p95_itl_ms']} ms",
             f"{'GPU':<10}{'$/h':>7}{'users/replica':>15}{'decode floor':>14}{'scale':>7}{'users':>7}"
             f"{'replicas':>10}{'fleet $/h':>11}{'$/1M out':>10}{'$/1M total':>12}"]
    for r in report["gpus"]:
        if "error" in r:
            lines.append(f"{r['gpu']:<10} {r['error']}")
            continue
        for label, s in r["scales"].items():
            money = [f"{s[k]:.3f}" if s[k] is not None else "n/a" for k in
                     ("fleet_usd_per_hour", "usd_per_1m_output_tokens", "usd_per_1m_total_tokens")]
            floor = f"{r['decode_floor_ms']:.1f} ms" + ("" if r["meets_brief_slo"] else "*")
            lines.append(f"{r['gpu']:<10}{r['price_usd_per_hour'] or 0:>7.2f}{r['users_per_replica']:>15}"
                         f"{floor:>14}{label:>7}{s['users']:>7}{s['replicas']:>10}{money[0]:>11}{money[1]:>10}"
                         f"{money[2]:>12}")
    for r in report["gpus"]:
        if not r["meets_brief_slo"]:
            why = (f"one decode step alone takes {r['decode_floor_ms']:.0f} ms > the ITL target"
                   if not r["itl_target_feasible"] else "no load met it")
            lines.append(f"* {r['gpu']} cannot meet the brief's SLO at any replica count ({why}); sized for "
                         f"{r['slo_used']} instead")
    for b in report.get("budget_sweep", []):
        lines.append(f"{b['gpu']}, {b['users']} users, max_num_batched_tokens {b['max_num_batched_tokens']}: p95 TTFT "
                     f"{b['p95_ttft_ms']:.0f} ms, p95 ITL {b['p95_itl_ms']:.1f} ms")
    lines.append(f"simulated in {report['wall_s']:.1f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default=",".join(GPUS))
    p.add_argument("--probes", type=int, default=8, help="at most this many simulations per GPU and SLO "
                   "(capacity bracketing; it stops once passing and failing users are within 3%%)")
    p.add_argument("--price", action="append", default=[], help="GPU=USD per hour, overriding the profile's")
    p.add_argument("--jobs", type=int, default=2, help="GPUs simulated in parallel processes")
    p.add_argument("--budget-sweep", help="also simulate these max_num_batched_tokens on the first GPU at the "
                   "brief's users, e.g. 512,1024,2048")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--no-margin", action="store_true", help="size against the SLO itself, not shrunk by what the "
                   "model under-predicted on the measured H200 runs (model_margin)")
    args = p.parse_args(argv)
    started = time.perf_counter()
    prices = dict(DEFAULT_PRICES)
    for item in args.price:
        gpu, usd = item.split("=", 1)
        prices[gpu] = (float(usd), "user input", "given on the command line")
    gpus = args.gpus.split(",")
    margin = model_margin() if not args.no_margin else {"p95_ttft_ms": 0.0, "p95_itl_ms": 0.0, "runs": [],
                                                         "source": "--no-margin"}
    if args.jobs > 1:
        with ProcessPoolExecutor(min(args.jobs, len(gpus))) as pool:
            results = list(pool.map(size_gpu, gpus, [args.probes] * len(gpus), [prices] * len(gpus),
                                    [margin] * len(gpus)))
    else:
        results = [size_gpu(g, args.probes, prices, margin) for g in gpus]
    profile, fix = load_case()
    report = {"what": "modelled with shared_engine.sim (the engine's scheduler in simulated time), not measured",
              "command": "python " + " ".join([str(Path(sys.argv[0]))] + sys.argv[1:]),
              "model": MODEL, "engine_config": {"model": MODEL, "max_model_len": profile["engine"]["max_model_len"],
                                                **fix},
              "workload_profile": profile, "slo": {k: profile["targets"][k] for k in ("p95_ttft_ms", "p95_itl_ms")},
              "model_margin": margin, "gpus": results}
    if args.budget_sweep:
        report["budget_sweep"] = budget_sweep(gpus[0], [int(b) for b in args.budget_sweep.split(",")])
    report["wall_s"] = time.perf_counter() - started
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
