"""First attempt vs the fix from the load test's results files: the well-behaved tenants' p99 TTFT against
their isolated run (target <= 1.2x), the fix's throughput against the base model at the same offered load
(target >= 90%), the whales' refusals; writes `loadtest/summary_<profile>.json` and the plots.

    python case_multilora/loadtest/report.py [--profile cpu|h200|h200q] [--plots case_multilora/plots]
        [--case-dir DIR (where the results files are)] [--summary PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CASE_DIR = Path(__file__).resolve().parents[1]
FILES = {"isolated": "the_fix/isolated_{profile}.json", "first_attempt": "first_attempt/results_{profile}.json",
         "the_fix": "the_fix/results_{profile}.json", "base": "the_fix/base_{profile}.json"}


def load(profile: str = "cpu", case_dir: Path = CASE_DIR) -> dict[str, dict]:
    files = {k: case_dir / v.format(profile=profile) for k, v in FILES.items()}
    return {k: json.loads(path.read_text()) for k, path in files.items() if path.exists()}


def compare(runs: dict[str, dict]) -> dict:
    """Ratios against the isolated and base runs; missing runs give None."""
    iso = runs.get("isolated", {}).get("summary", {}).get("well-behaved", {}).get("p99_ttft_ms")
    base = runs.get("base", {}).get("summary", {}).get("output_tokens_per_s")
    profile = next(iter(runs.values()), {}).get("profile", "cpu")
    out = {"files": {k: FILES[k].format(profile=profile) for k in runs}, "isolated_p99_ttft_ms": iso,
           "base_output_tokens_per_s": base, "runs": {},
           "targets": {"p99_ttft_vs_isolated_max": 1.2, "throughput_vs_base_min": 0.9}}
    for name, run in runs.items():
        s = run["summary"]
        wb, whale = s["well-behaved"], s["whale"]
        out["runs"][name] = {
            "commit": run["environment"]["commit"], "command": run["command"],
            "load_average_before": run["load_average_before"],
            "well_behaved_p99_ttft_ms": wb["p99_ttft_ms"], "well_behaved_median_ttft_ms": wb["median_ttft_ms"],
            "p99_ttft_vs_isolated": round(wb["p99_ttft_ms"] / iso, 2) if iso and wb["p99_ttft_ms"] else None,
            "output_tokens_per_s": s["output_tokens_per_s"],
            "throughput_vs_base": round(s["output_tokens_per_s"] / base, 3) if base else None,
            "well_behaved_statuses": wb["statuses"], "whale_statuses": whale["statuses"],
            "num_preemptions": run["engine_metrics"].get("vllm:num_preemptions_total"),
            **burst_split(run)}
    return out


def burst_split(run: dict) -> dict:
    """Well-behaved TTFT median and max (ms) for requests sent while the whales' burst was ON (the first half
    of every burst period) and while it was OFF: where the whales' load lands."""
    period = run["load"].get("burst_period_s", 30.0)
    out = {}
    for name, on in (("on", True), ("off", False)):
        ttft = sorted(s["ttft_s"] * 1000 for s in run["samples"]
                      if s["kind"] == "well-behaved" and "ttft_s" in s and ((s["t_s"] % period) < period / 2) == on)
        out[f"well_behaved_burst_{name}"] = {"num": len(ttft), "median_ttft_ms": round(ttft[(len(ttft) - 1) // 2], 1)
                                             if ttft else None, "max_ttft_ms": round(ttft[-1], 1) if ttft else None}
    return out


def plot(runs: dict[str, dict], summary: dict, plots: Path, profile: str = "cpu") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    names = [n for n in ("isolated", "first_attempt", "the_fix", "base") if n in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, name in enumerate(names):
        wb = [s for s in runs[name]["samples"] if s["kind"] == "well-behaved" and "ttft_s" in s]
        left.scatter([s["t_s"] for s in wb], [s["ttft_s"] for s in wb], s=8, label=name, color=f"C{i}")
    any_ttft = any("ttft_s" in s for n in names for s in runs[n]["samples"] if s["kind"] == "well-behaved")
    left.set(yscale="log" if any_ttft else "linear", xlabel="time in the run (s)", ylabel="well-behaved TTFT (s)",
             title="well-behaved tenants' TTFT (whales burst in the first half of every 30 s)")
    left.title.set_fontsize(8)
    left.legend(fontsize=7)
    p99 = [summary["runs"][n]["well_behaved_p99_ttft_ms"] or 0 for n in names]
    right.bar(names, [v / 1000 for v in p99], color=[f"C{i}" for i in range(len(names))])
    if summary["isolated_p99_ttft_ms"]:
        right.axhline(1.2 * summary["isolated_p99_ttft_ms"] / 1000, linestyle="--", color="grey",
                      label="1.2x isolated (target)")
        right.legend(fontsize=7)
    where = {"cpu": "CPU, SmolLM2-135M, 4 trained adapters", "h200": "H200, llama-3.1-8b dummy, 30 adapters",
             "h200q": "H200, llama-3.1-8b dummy, 30 adapters, 60 s phases"}
    right.set(ylabel="well-behaved p99 TTFT (s)", title=f"p99 TTFT ({where.get(profile, profile)})")
    right.title.set_fontsize(8)
    commits = ", ".join(f"{n} {summary['runs'][n]['commit'][:7]}" for n in names)
    fig.suptitle(f"runs at: {commits}; results files and command: loadtest/summary_{profile}.json "
                 f"(python case_multilora/loadtest/report.py --profile {profile})", fontsize=7)
    fig.tight_layout()
    path = plots / f"ttft_{profile}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plots", type=Path, default=CASE_DIR / "plots")
    parser.add_argument("--profile", default="cpu", choices=["cpu", "h200", "h200q"])
    parser.add_argument("--case-dir", type=Path, default=CASE_DIR)
    parser.add_argument("--summary", type=Path, default=None, help="default: CASE_DIR/loadtest/summary_<profile>.json")
    args = parser.parse_args()
    runs = load(args.profile, args.case_dir)
    if not runs:
        raise SystemExit(f"no results files for profile {args.profile} under {args.case_dir}")
    summary = compare(runs)
    path = args.summary or CASE_DIR / "loadtest" / f"summary_{args.profile}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    for path in plot(runs, summary, args.plots, args.profile):
        print("wrote", path)


if __name__ == "__main__":
    main()
