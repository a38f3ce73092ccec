"""Plots and the README's "The Numbers" section, generated from the results files (nothing typed by hand).

    python case_rag_chatbot/report.py            # plots/*.png and README.md between the numbers markers

Results files: `<variant>/results_<profile>.json` (one measured window, `loadtest/run_case.py`),
`<variant>/sweep_<profile>.json` (a user sweep) and `the_fix/one_replica_<profile>.json` (the fix's config
on one GPU, an extra column when present), for the variants `first_attempt` and `the_fix` and the
profiles `cpu` (this 2-core CPU, scaled down) and `h200` (the brief's scale). A profile without both results
files is listed as not measured yet, with the command that measures it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

CASE_DIR = Path(__file__).resolve().parent
VARIANTS = ("first_attempt", "the_fix")
PROFILES = {"cpu": "this 2-core CPU, scaled down (SmolLM2-135M-Instruct)",
            "h200": "NVIDIA H200, the brief's scale (llama-3.1-8b shapes, dummy weights)"}
BLOCKS = {  # README marker name -> generator; each block sits between <!-- NAME:start ... --> and <!-- NAME:end -->
    "numbers": lambda: numbers_section(),
    "broke": lambda: broke_section(),
    "tenx": lambda: tenx_section(),
    "budget": lambda: budget_section(),
}
LABELS = {"first_attempt": "First attempt", "the_fix": "The fix"}
# Optional columns between the two variants: (variant, results-file kind, label). `the_fix/one_replica_h200.json`
# is the fix's config on one GPU, the run that showed one H200 is not enough for 200 users.
EXTRA_COLUMNS = (("the_fix", "one_replica", "The fix's config, one replica"),)


def load(variant: str, profile: str, kind: str = "results") -> dict | None:
    path = CASE_DIR / variant / f"{kind}_{profile}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _ms(v: float) -> str:
    return f"{v:,.0f} ms" if v >= 100 else f"{v:,.1f} ms"


ROWS = [  # (label, getter, formatter)
    ("Engine replicas (one GPU each on the H200)", lambda r: r.get("replicas", 1), lambda v: f"{v}"),
    ("Users (closed loop) / mean think time", lambda r: (r["load"]["users"], r["load"]["think_time_mean_s"]),
     lambda v: f"{v[0]} / {v[1]:g} s"),
    ("Requests measured (completed / started)", lambda r: (r["summary"]["completed"], r["summary"]["num_requests"]),
     lambda v: f"{v[0]} / {v[1]}"),
    ("Request throughput", lambda r: r["summary"]["request_throughput"], lambda v: f"{v:.2f} req/s"),
    ("Output throughput", lambda r: r["summary"]["output_throughput"], lambda v: f"{v:,.1f} tok/s"),
    ("TTFT median", lambda r: r["summary"]["median_ttft_ms"], _ms),
    ("**TTFT p95**", lambda r: r["summary"]["p95_ttft_ms"], _ms),
    ("TTFT p99", lambda r: r["summary"]["p99_ttft_ms"], _ms),
    ("TTFT p95, RAG / document requests", lambda r: (r["summary"]["ttft_by_kind_rag"]["p95_ttft_ms"],
                                                     r["summary"]["ttft_by_kind_document"]),
     lambda v: f"{_ms(v[0])} / " + (_ms(v[1]["p95_ttft_ms"]) if v[1]["count"] else "none finished")),
    ("ITL median", lambda r: r["summary"]["median_itl_ms"], _ms),
    ("**ITL p95**", lambda r: r["summary"]["p95_itl_ms"], _ms),
    ("ITL p99", lambda r: r["summary"]["p99_itl_ms"], _ms),
    ("TPOT median", lambda r: r["summary"]["median_tpot_ms"], _ms),
    ("E2E latency median", lambda r: r["summary"]["median_e2el_ms"], _ms),
    ("**System-prompt hit rate** (per-request cached_tokens)", lambda r: r["summary"]["system_prompt_hit_rate"],
     lambda v: f"{v:.1%}"),
    ("Prefix cache hit rate, all prompt tokens (`vllm:prefix_cache_hits/queries`)",
     lambda r: r["summary"]["engine"]["prefix_cache_hit_rate"], lambda v: f"{v:.1%}"),
    ("Prompt tokens per request, sent / computed (sent less `cached_tokens`)",
     lambda r: (r["summary"]["mean_prompt_tokens"], r["summary"]["mean_uncached_prompt_tokens"]),
     lambda v: f"{v[0]:,.0f} / {v[1]:,.0f}"),
    ("Prefill tokens per second (`vllm:prompt_tokens_total`)",
     lambda r: r["summary"]["engine"]["prefill_tokens_computed"] / r["load"]["duration_s"], lambda v: f"{v:,.1f}"),
    ("`vllm:num_requests_running` mean", lambda r: r["summary"]["engine"]["mean_num_requests_running"],
     lambda v: f"{v:.1f}"),
    ("`vllm:num_requests_waiting` mean / max", lambda r: (r["summary"]["engine"]["mean_num_requests_waiting"],
                                                          r["summary"]["engine"]["max_num_requests_waiting"]),
     lambda v: f"{v[0]:.1f} / {v[1]:.0f}"),
    ("`vllm:kv_cache_usage_perc` max", lambda r: r["summary"]["engine"]["max_kv_cache_usage_perc"],
     lambda v: f"{v:.0%}"),
    ("KV pool turnovers in the window (prefilled tokens / pool)", lambda r: kv_turnovers(r), lambda v: f"{v:.1f}"),
    ("Preemptions", lambda r: r["summary"]["engine"]["num_preemptions"], lambda v: f"{v:.0f}"),
    ("Tokens per engine step, mean (`vllm:iteration_tokens_total`)",
     lambda r: r["summary"]["engine"]["mean_tokens_per_step"], lambda v: f"{v:.1f}"),
    ("Idle reference: one request alone, TTFT / ITL", lambda r: (r["idle_reference"]["ttft_ms"],
                                                              r["idle_reference"]["median_itl_ms"]),
     lambda v: f"{_ms(v[0])} / {_ms(v[1])}"),
    ("**Targets met**", lambda r: r["summary"]["targets_met"]["all"], lambda v: "yes" if v else "**no**"),
]


def kv_turnovers(r: dict) -> float:
    blocks = r["engine_config"].get("num_gpu_blocks_override")
    if not blocks:
        return float("nan")
    return r["summary"]["engine"]["prefill_tokens_computed"] / (blocks * r["engine_config"].get("block_size", 16))


def _cell(row, result: dict | None) -> str:
    _, get, fmt = row
    if result is None:
        return "not measured"
    try:
        return fmt(get(result))
    except (KeyError, TypeError):
        return "n/a"


def device_text(result: dict) -> str:
    """The hardware a results file ran on, e.g. "2 x NVIDIA H200, one engine replica per GPU"."""
    hw = result["hardware"]
    device = hw.get("gpu") or f"{hw.get('cpu')} ({hw.get('cpu_cores')} cores)"
    if result.get("replicas", 1) > 1:
        device = f"{result['replicas']} x {device}, one engine replica per GPU"
    return device


def provenance(result: dict, label: str) -> str:
    hw = result["hardware"]
    device = device_text(result)
    model = result["model"].get("root") or result["model"].get("id")
    load = hw.get("load_average_1_5_15")
    load_text = f", load average {load[0]:.1f}" if load else ""
    return (f"- {label}: {device}{load_text}; model `{model}`; commit `{result['commit']}`; "
            f"{result['date']}; engine `{result['server_command']}`; command `{result['command']}`")


def targets_text(profile: str, result: dict) -> str:
    t = result["targets"]
    return (f"targets: p95 TTFT <= {t['p95_ttft_ms']:,} ms, p95 ITL <= {t['p95_itl_ms']:,} ms, "
            f"system-prompt hit rate >= {t['min_system_prompt_hit_rate']:.0%}")


def profile_section(profile: str) -> str:
    results = {v: load(v, profile) for v in VARIANTS}
    lines = [f"### {PROFILES[profile]}", ""]
    if not all(results.values()):
        missing = [v for v, r in results.items() if r is None]
        lines += [f"Not measured yet ({', '.join(missing)}). Measure with:", "", "```"]
        if profile == "h200":
            lines += [f"GIT_COMMIT=<sha> case_rag_chatbot/loadtest/h200_run.sh OUTDIR {v}" for v in missing]
        else:
            lines += [f"python case_rag_chatbot/loadtest/run_case.py --profile {profile} --variant {v}"
                      for v in missing]
        lines += ["```", ""]
        if not any(results.values()):
            return "\n".join(lines)
    any_result = next(r for r in results.values() if r)
    columns = [(LABELS["first_attempt"], results["first_attempt"])]
    columns += [(label, load(v, profile, kind)) for v, kind, label in EXTRA_COLUMNS if load(v, profile, kind)]
    columns += [(LABELS["the_fix"], results["the_fix"])]
    lines += [f"Measured ({targets_text(profile, any_result)}):", "",
              "| | " + " | ".join(label for label, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    for row in ROWS:
        lines.append(f"| {row[0]} | " + " | ".join(_cell(row, r) for _, r in columns) + " |")
    lines += ["", "Where and how:"]
    lines += [provenance(r, label) for label, r in columns if r]
    for name in ("latency", "engine"):
        if (CASE_DIR / "plots" / f"{name}_{profile}.png").exists():
            lines += ["", f"![{name} {profile}](plots/{name}_{profile}.png)"]
    sweep = load("the_fix", profile, "sweep")
    if sweep:
        lines += ["", f"User sweep of the fix on {device_text(sweep)} (`{sweep['command']}`, commit "
                  f"`{sweep['commit']}`):", "",
                  "| users | req/s | p95 TTFT | p95 ITL | system-prompt hits | targets met |",
                  "|---|---|---|---|---|---|"]
        for run in sweep["runs"]:
            s = run["summary"]
            lines.append(f"| {run['load']['users']} | {s['request_throughput']:.2f} | {_ms(s['p95_ttft_ms'])} | "
                         f"{_ms(s['p95_itl_ms'])} | {s['system_prompt_hit_rate']:.1%} | "
                         f"{'yes' if s['targets_met']['all'] else 'no'} |")
        best = sweep.get("highest_sustained")
        lines += ["", f"Highest load sustained within the targets: {best['users']} users, "
                  f"{best['request_throughput']:.2f} req/s." if best else "", "No swept load met the targets."
                  if not best else ""]
    return "\n".join(lines).rstrip() + "\n"


def numbers_section() -> str:
    parts = ["Every figure below is read from the results files by `python case_rag_chatbot/report.py`.", ""]
    parts += [profile_section(p) for p in PROFILES]
    return "\n".join(parts)


def broke_section() -> str:
    """The first attempt's symptoms, per measured profile, as an operator reads them."""
    lines = []
    for profile, title in PROFILES.items():
        r, fix = load("first_attempt", profile), load("the_fix", profile)
        if r is None:
            lines.append(f"- {title}: not measured yet.")
            continue
        s, e, t = r["summary"], r["summary"]["engine"], r["targets"]
        lines.append(
            f"- {title}, {r['load']['users']} users: p95 TTFT **{_ms(s['p95_ttft_ms'])}** (target "
            f"{t['p95_ttft_ms']:,} ms), p95 ITL **{_ms(s['p95_itl_ms'])}** (target {t['p95_itl_ms']:,} ms); "
            f"{s['completed']} of {s['num_requests']} requests finished; `vllm:num_requests_waiting` up to "
            f"{e['max_num_requests_waiting']:.0f}; prefix cache hit rate {e['prefix_cache_hit_rate']:.1%} "
            f"(system prompt {s['system_prompt_hit_rate']:.1%}); {s['mean_uncached_prompt_tokens']:,.0f} of "
            f"{s['mean_prompt_tokens']:,.0f} prompt tokens computed per request"
            + (f" (the fix: {fix['summary']['mean_uncached_prompt_tokens']:,.0f})" if fix else "") + ".")
    return "\n".join(lines) + "\n"


def tenx_section(path: Path = CASE_DIR / "cost_model.json") -> str:
    if not path.exists():
        return "Not computed yet: `python case_rag_chatbot/cost_model.py --json case_rag_chatbot/cost_model.json`.\n"
    report = json.loads(path.read_text())
    slo = report["slo"]
    lines = [f"Modelled, not measured (`{report['command']}`: the engine's scheduler in simulated time, "
             f"{report['model']}, the fix's config, SLO p95 TTFT <= {slo['p95_ttft_ms']} ms and p95 ITL <= "
             f"{slo['p95_itl_ms']} ms{_margin_text(report)}):", "",
             "| GPU | $/hour (dated) | users per replica | replicas, 200 users | replicas, 2,000 users | "
             "$ per 1M output tokens (200 / 2,000 users) | meets the brief's SLO |", "|---|---|---|---|---|---|---|"]
    for g in report["gpus"]:
        if "error" in g:
            lines.append(f"| {g['gpu']} | | {g['error']} | | | | no |")
            continue
        one, ten = g["scales"]["1x"], g["scales"]["10x"]
        money = "n/a" if one["usd_per_1m_output_tokens"] is None else (
            f"{one['usd_per_1m_output_tokens']:.2f} / {ten['usd_per_1m_output_tokens']:.2f}")
        meets = "yes" if g["meets_brief_slo"] else (
            f"no: decode step {g['decode_floor_ms']:.0f} ms > ITL target; sized for p95 TTFT <= "
            f"{g['slo_used']['p95_ttft_ms']:,} ms" if not g["itl_target_feasible"] else "no")
        lines.append(f"| {g['gpu']} | {g['price_usd_per_hour']:.2f} ({g['price_date']}) | {g['users_per_replica']} | "
                     f"{one['replicas']} | {ten['replicas']} | {money} | {meets} |")
    lines += ["", "Prices: " + "; ".join(f"{g['gpu']}: {g['price_source']}" for g in report["gpus"]) + "."]
    return "\n".join(lines) + "\n"


def _margin_text(report: dict) -> str:
    """How the cost model's SLO was shrunk by its measured under-prediction (`cost_model.model_margin`)."""
    margin = report.get("model_margin")
    if not margin or not margin.get("runs"):
        return ""
    model_slo = next((g["model_slo"] for g in report["gpus"] if g.get("meets_brief_slo") and "model_slo" in g), None)
    if model_slo is None:
        return ""
    return (f", held in the model to p95 TTFT <= {model_slo['p95_ttft_ms']:.0f} ms and p95 ITL <= "
            f"{model_slo['p95_itl_ms']:.1f} ms: the most it under-predicted them on {len(margin['runs'])} measured "
            f"H200 serving runs ({margin['p95_ttft_ms']:+.0%} / {margin['p95_itl_ms']:+.0%}, `{margin['source']}`)")


def budget_section(path: Path = CASE_DIR / "cost_model.json") -> str:
    sweep = json.loads(path.read_text()).get("budget_sweep") if path.exists() else None
    if not sweep:
        return "Not computed yet: `python case_rag_chatbot/cost_model.py --budget-sweep 256,512,1024,2048`.\n"
    lines = [f"Modelled with `cost_model.py --budget-sweep` ({sweep[0]['gpu']}, {sweep[0]['users']} users, the fix "
             "otherwise):", "", "| max_num_batched_tokens | p95 TTFT | p95 ITL |", "|---|---|---|"]
    lines += [f"| {b['max_num_batched_tokens']:,} | {_ms(b['p95_ttft_ms'])} | {_ms(b['p95_itl_ms'])} |" for b in sweep]
    return "\n".join(lines) + "\n"


def evidence_section(variant: str) -> str:
    """A variant's measured figures per profile, for its NOTES.md."""
    lines = []
    for profile, title in PROFILES.items():
        r = load(variant, profile)
        if r is None:
            lines.append(f"- {title}: not measured yet.")
            continue
        s, e, t = r["summary"], r["summary"]["engine"], r["summary"]["targets_met"]
        lines.append(
            f"- {title} (`{variant}/results_{profile}.json`, commit `{r['commit'][:12]}`): p95 TTFT "
            f"{_ms(s['p95_ttft_ms'])}, p95 ITL {_ms(s['p95_itl_ms'])}, system-prompt hit rate "
            f"{s['system_prompt_hit_rate']:.1%}, {s['mean_uncached_prompt_tokens']:,.0f} of "
            f"{s['mean_prompt_tokens']:,.0f} prompt tokens computed per request, `vllm:num_requests_waiting` max "
            f"{e['max_num_requests_waiting']:.0f}, KV usage max {e['max_kv_cache_usage_perc']:.0%}, "
            f"{s['completed']}/{s['num_requests']} requests finished; targets met: "
            f"{'yes' if t['all'] else 'no'}.")
    return "\n".join(lines) + "\n"


NOTES_BLOCKS = {"evidence": evidence_section}


def update_readme(path: Path = CASE_DIR / "README.md") -> list[str]:
    """Replace every generated block whose markers are in the README (and each variant's NOTES.md);
    returns the names replaced."""
    done = []
    for variant in VARIANTS:
        notes = CASE_DIR / variant / "NOTES.md"
        if notes.exists():
            done += _replace_blocks(notes, {k: (lambda f=f, v=variant: f(v)) for k, f in NOTES_BLOCKS.items()})
    return _replace_blocks(path, BLOCKS) + done


def _replace_blocks(path: Path, blocks: dict) -> list[str]:
    text, done = path.read_text(), []
    for name, make in blocks.items():
        start, end = f"<!-- {name}:start (generated by report.py) -->", f"<!-- {name}:end -->"
        if start in text and end in text:
            pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
            text = pattern.sub(lambda _, s=start, e=end, m=make: f"{s}\n{m()}{e}", text)
            done.append(f"{path.relative_to(CASE_DIR)}:{name}")
    path.write_text(text)
    return done


def main() -> int:
    from plots.make_plots import make_all

    sys.path.insert(0, str(CASE_DIR))
    written = make_all(CASE_DIR)
    print("plots:", ", ".join(str(p.relative_to(CASE_DIR)) for p in written) or "none (no results yet)")
    print("README blocks updated:", ", ".join(update_readme()) or "none (no markers in README.md)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(CASE_DIR))
    sys.exit(main())
