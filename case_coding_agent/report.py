"""Plots and the README's numbers tables, generated from the results files (nothing typed by hand).

    python -m case_coding_agent.report     # plots/*.png and README.md between the <!-- numbers --> markers

Measured: `<variant>/results_cpu.json` (loadtest/run_case.py). Modelled: `<variant>/sim_h200.json`
(sim_case.py) and `cost_model.json` (cost_model.py). A file that is missing is named with its command.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

CASE_DIR = Path(__file__).resolve().parent
VARIANTS = ("first_attempt", "the_fix")
ROWS = [  # (summary key, label, format)
    ("turns2plus_hit_rate", "prompt-token hit rate, turns >= 2", "{:.1%}"),
    ("turns2plus_hit_rate_ceiling", "  ceiling (previous prompt, whole blocks)", "{:.1%}"),
    ("p99_warm_ttft_during_cold_ms", "p99 warm-turn TTFT during a cold long prefill (ms)", "{:,.0f}"),
    ("num_warm_turns_during_cold_prefill", "  warm turns in that window", "{}"),
    ("median_warm_ttft_ms", "median warm-turn TTFT (ms)", "{:,.0f}"),
    ("p99_warm_ttft_ms", "p99 warm-turn TTFT (ms)", "{:,.0f}"),
    ("all_median_itl_ms", "median ITL, all turns (ms)", "{:,.1f}"),
    ("edit_median_tpot_ms", "median TPOT, edit turns (ms)", "{:,.1f}"),
    ("sessions_on_one_replica", "sessions whose turns all hit one replica", "{}"),
    ("recomputed_share_of_prompt_tokens", "previous turns' tokens computed again (share of prompt tokens)",
     "{:.1%}"),
    ("recomputed_prompt_tokens", "prompt tokens computed (not from cache)", "{:,}"),
    ("num_preemptions", "preemptions", "{}"),
]


def fmt(value, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def table(results: dict[str, dict], extra: dict[str, dict] | None = None) -> str:
    lines = ["| | " + " | ".join(r["variant"].replace("_", " ") for r in results.values()) + " |",
             "|---|" + "---|" * len(results)]
    for key, label, pattern in ROWS:
        values = [(extra or {}).get(v, {}).get(key, r["summary"].get(key)) for v, r in results.items()]
        if all(x is None for x in values):
            continue
        lines.append(f"| {label} | " + " | ".join(fmt(x, pattern) for x in values) + " |")
    return "\n".join(lines)


def counters(r: dict) -> dict:
    """Engine counters summed over the replicas (the measured runs' /metrics deltas)."""
    reps = r.get("replica_counters", {}).values()
    total = {k: sum(c[k] for c in reps) for k in ("vllm:prompt_tokens", "vllm:num_preemptions",
                                                   "vllm:spec_decode_num_draft_tokens",
                                                   "vllm:spec_decode_num_accepted_tokens")}
    return {"recomputed_prompt_tokens": int(total["vllm:prompt_tokens"]),
            "num_preemptions": int(total["vllm:num_preemptions"]), "_spec": total}


def measured_section() -> str:
    found = {v: json.loads(p.read_text()) for v in VARIANTS if (p := CASE_DIR / v / "results_cpu.json").exists()}
    if len(found) < 2:
        return "Not measured yet: `python -m case_coding_agent.loadtest.run_case --profile cpu --variant VARIANT`."
    out = [table(found, {v: counters(r) for v, r in found.items()}), ""]
    for v, r in found.items():
        spec = counters(r)["_spec"]
        accepted = (f"; speculation: {spec['vllm:spec_decode_num_accepted_tokens']:.0f} of "
                    f"{spec['vllm:spec_decode_num_draft_tokens']:.0f} draft tokens accepted"
                    if spec["vllm:spec_decode_num_draft_tokens"] else "")
        out.append(f"- {v.replace('_', ' ')}: `{r['command']}` at commit {r['commit']}, {r['date']}; "
                   f"{r['hardware']['cpu']} ({r['machine_before']['cpu_count']} cores, shared: load average "
                   f"{r['machine_before']['loadavg'][0]:.1f} at the start, {r['machine_after']['loadavg'][0]:.1f} "
                   f"at the end), {r['model']['id']}, `{r['config_file']}` + {r['profile_engine_flags']}, "
                   f"routing {r['routing']}, wall {r['wall_s']:.0f} s{accepted}.")
    return "\n".join(out)


def modelled_section() -> str:
    found = {v: json.loads(p.read_text()) for v in VARIANTS if (p := CASE_DIR / v / "sim_h200.json").exists()}
    if len(found) < 2:
        return "Not modelled yet: `python -m case_coding_agent.sim_case --variant VARIANT`."
    out = ["**Modelled, not measured** (the simulator runs the engine's scheduler and block manager in simulated "
           "time with step times fitted to the H200 llama-3.1-8b step profile):", "", table(found), ""]
    for v, r in found.items():
        s = r["summary"]
        out.append(f"- {v.replace('_', ' ')}: `{r['command']}` at commit {r['commit']}; 2 x {r['gpu']} "
                   f"(modelled), {r['num_kv_blocks_per_replica']:,} KV blocks a replica, routing {r['routing']}; "
                   f"output throughput {s['output_throughput']:,} tok/s over a {s['makespan_s']:,} s run.")
    return "\n".join(out)


def cost_section() -> str:
    path = CASE_DIR / "cost_model.json"
    if not path.exists():
        return "Not modelled yet: `python -m case_coding_agent.cost_model --json case_coding_agent/cost_model.json`."
    c = json.loads(path.read_text())
    rows = ["| sessions on one H200 (modelled) | p99 warm TTFT (ms) | hit rate turns >= 2 | median ITL (ms) | "
            "output tok/s |", "|---|---|---|---|---|"]
    for r in c["sweep"]:
        rows.append(f"| {r['sessions']} | {fmt(r['p99_warm_ttft_ms'], '{:,.0f}')} | "
                    f"{fmt(r['turns2plus_hit_rate'], '{:.1%}')} | {fmt(r['all_median_itl_ms'], '{:.1f}')} | "
                    f"{fmt(r['output_throughput'], '{:,.0f}')} |")
    b, x = c["brief"], c["at_10x"]
    nxt = c["next_bottleneck"]
    rows += ["", f"**Modelled**: {c['sessions_per_gpu']} sessions per H200 meet the SLOs "
             f"(${c['price_usd_per_gpu_hour']}/GPU-hour: ${c['usd_per_session_hour_at_capacity']} per "
             f"session-hour at capacity). The brief's {b['concurrent_sessions']} sessions: {b['gpus']} "
             f"GPU{'s' if b['gpus'] != 1 else ''}, "
             f"${b['usd_per_hour']}/hour (${b['usd_per_session_hour']} per session-hour). At 10x "
             f"({x['concurrent_sessions']} sessions): {x['gpus']} GPUs, ${x['usd_per_hour']}/hour. Next bottleneck: "
             + (f"at {nxt['sessions']} sessions a GPU, {'; '.join(nxt['missed'])}; {nxt['num_preemptions']} "
                f"preemptions and {fmt(nxt['computed_prompt_share'], '{:.1%}')} of prompt tokens computed: the "
                f"KV pool ({c['kv_pool_tokens_per_gpu']:,} tokens a GPU) no longer holds every live session."
                if nxt else
                "none within the sweep (extend `--sessions`).")
             + f" Commands: `{c['sweep_command']}` (commit {c['sweep_commit']}), then `{c['command']}`."]
    return "\n".join(rows)


def broke_section() -> str:
    path = CASE_DIR / "first_attempt" / "results_cpu.json"
    if not path.exists():
        return ("Not measured yet: "
                "`python -m case_coding_agent.loadtest.run_case --profile cpu --variant first_attempt`.")
    r = json.loads(path.read_text())
    s = r["summary"]
    per_replica = ", ".join(f"{addr} {c['prefix_cache_hit_rate']:.1%}" for addr, c in r["replica_counters"].items())
    return "\n".join([
        f"- Prefix hits on turns >= 2: {fmt(s['turns2plus_hit_rate'], '{:.1%}')} of prompt tokens, against a "
        f"ceiling of {fmt(s['turns2plus_hit_rate_ceiling'], '{:.1%}')}; each replica's own counters "
        f"(`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`, all turns): {per_replica}.",
        f"- {s['sessions_on_one_replica']} of {s['num_sessions']} sessions stayed on one replica "
        f"(`X-Upstream-Addr` per turn).",
        f"- Warm turns that waited while the cold paste prefilled: {s['num_warm_turns_during_cold_prefill']}, "
        f"p99 TTFT {fmt(s['p99_warm_ttft_during_cold_ms'], '{:,.0f}')} ms (median warm TTFT overall "
        f"{fmt(s['median_warm_ttft_ms'], '{:,.0f}')} ms); the paste's own TTFT "
        f"{', '.join(f'{x:,.0f}' for x in s['cold_ttft_ms'])} ms.",
        f"- Edit turns: median TPOT {fmt(s['edit_median_tpot_ms'], '{:,.0f}')} ms, one token per step.",
        f"- From `{r['command']}` at {r['commit']} ({r['date']}, load average "
        f"{r['machine_before']['loadavg'][0]:.1f}).",
    ])


def spec_section() -> str:
    on, off = (CASE_DIR / "the_fix" / f"sim_{k}_sweep_h200.json" for k in ("spec", "nospec"))
    if not (on.exists() and off.exists()):
        return ("Not modelled yet: `python -m case_coding_agent.sim_case --variant the_fix --acceptance-rate 0.69 "
                "--sessions 4,32 --out the_fix/sim_spec_sweep_h200.json` and the same with `--set "
                "speculative_config=null --out the_fix/sim_nospec_sweep_h200.json`.")
    a, b = json.loads(on.read_text()), json.loads(off.read_text())
    rows = ["| sessions on one H200 (modelled) | median ITL, spec / none (ms) | median TPOT of edit turns, spec / "
            "none (ms) | TPOT ratio | output tok/s, spec / none |", "|---|---|---|---|---|"]
    for x, y in zip(a["sweep"], b["sweep"]):
        sx, sy = x["summary"], y["summary"]
        ratio = sy["edit_median_tpot_ms"] / sx["edit_median_tpot_ms"] if sx["edit_median_tpot_ms"] else None
        rows.append(f"| {x['sessions']} | {fmt(sx['all_median_itl_ms'], '{:.1f}')} / "
                    f"{fmt(sy['all_median_itl_ms'], '{:.1f}')} | {fmt(sx['edit_median_tpot_ms'], '{:.1f}')} / "
                    f"{fmt(sy['edit_median_tpot_ms'], '{:.1f}')} | {fmt(ratio, '{:.2f}x')} | "
                    f"{fmt(sx['output_throughput'], '{:,.0f}')} / {fmt(sy['output_throughput'], '{:,.0f}')} |")
    rows += ["", f"Commands: `{a['command']}` ({a['commit']}), `{b['command']}` ({b['commit']}). Output tok/s is "
             "over each run's makespan with its tool pauses (closed-loop sessions), not a saturated throughput."]
    return "\n".join(rows)


def oversub_section() -> str:
    """The fix on one replica whose pool is smaller than the sessions' peak need, with and without KV offload:
    the_fix/results_cpu_pool<tokens>_{offload,lru}.json."""
    files = sorted((CASE_DIR / "the_fix").glob("results_cpu_pool*_*.json"),
                   key=lambda p: (-int(p.stem.split("_")[2].removeprefix("pool")), p.stem))
    if not files:
        return ("Not measured yet: `python -m case_coding_agent.loadtest.run_case --profile cpu --variant the_fix "
                "--replicas 1 --serve-arg=--num-gpu-blocks-override=N [--serve-arg=--kv-offload-size=1] --out "
                "case_coding_agent/the_fix/results_cpu_pool<tokens>_<offload|lru>.json`.")
    rows = ["| pool (tokens) | KV offload | peak need / pool | hit rate turns >= 2 (ceiling) | previous turns' tokens "
            "computed again | p99 warm TTFT during the cold prefill (ms) | median warm TTFT (ms) |",
            "|---|---|---|---|---|---|---|"]
    runs = []
    for p in files:
        r = json.loads(p.read_text())
        s = r["summary"]
        offload = any("--kv-offload-size" in c for c in r["server_commands"])
        rows.append(f"| {sum(s['kv_pool_tokens']):,} | {'1 GiB host tier' if offload else 'no (LRU only)'} | "
                    f"{fmt(s['kv_oversubscription'], '{:.2f}x')} | {fmt(s['turns2plus_hit_rate'], '{:.1%}')} "
                    f"({fmt(s['turns2plus_hit_rate_ceiling'], '{:.1%}')}) | "
                    f"{fmt(s['recomputed_share_of_prompt_tokens'], '{:.1%}')} "
                    f"({s['recomputed_reusable_tokens']:,} tokens) | "
                    f"{fmt(s['p99_warm_ttft_during_cold_ms'], '{:,.0f}')} | "
                    f"{fmt(s['median_warm_ttft_ms'], '{:,.0f}')} |")
        runs.append(f"`{p.name}`: `{r['command']}` at {r['commit'][:7]}, load average "
                    f"{r['machine_before']['loadavg'][0]:.1f}, wall {r['wall_s']:.0f} s")
    return "\n".join(rows + ["", "Files and commands: " + "; ".join(runs) + "."])


BLOCKS = {"oversub": oversub_section, "spec": spec_section, "broke": broke_section, "measured": measured_section,
          "modelled": modelled_section, "tenx": cost_section}


def update_readme(readme: Path) -> None:
    text = readme.read_text()
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- {name}:start[^>]*-->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{readme} has no <!-- {name}:start --> ... <!-- {name}:end --> block")
        body = make()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    readme.write_text(text)


def main() -> int:
    from case_coding_agent.plots.make_plots import make_all

    for path in make_all(CASE_DIR):
        print(f"wrote {path}")
    update_readme(CASE_DIR / "README.md")
    print(f"updated {CASE_DIR / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
