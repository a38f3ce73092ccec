"""PNGs of first attempt vs fix, from the results files (`report.py` calls this; needs matplotlib).

- `cpu_turns.png`: every turn's TTFT against its send time on this CPU, per variant, the cold paste's
  prefill window shaded; and each turn's cached share of its prompt (turns >= 2) against the ceiling.
- `cpu_summary.png`: the brief's three figures side by side (hit rate on turns >= 2, p99 warm-turn TTFT while
  the cold prefill ran, median TPOT of edit turns).
- `h200_modelled.png`: the same three from the simulator's H200 runs (`sim_h200.json`), labelled modelled.
"""

from __future__ import annotations

import json
from pathlib import Path

COLORS = {"first_attempt": "#c0392b", "the_fix": "#1f77b4"}
LABELS = {"first_attempt": "first attempt", "the_fix": "the fix"}


def load(case_dir: Path, name: str) -> dict:
    out = {}
    for variant in COLORS:
        path = case_dir / variant / name
        if path.exists():
            out[variant] = json.loads(path.read_text())
    return out


def turns_plot(results: dict, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for variant, r in results.items():
        turns = [t for t in r["turns"] if t["ttft_s"] is not None]
        warm = [t for t in turns if t["kind"] != "cold"]
        axes[0].scatter([t["start_s"] for t in warm], [t["ttft_s"] for t in warm], s=18, color=COLORS[variant],
                        label=f"{LABELS[variant]}: warm and first turns")
        for t in turns:
            if t["kind"] == "cold":
                axes[0].axvspan(t["start_s"], t["first_token_s"], color=COLORS[variant], alpha=0.12)
        later = [t for t in turns if t["turn"] >= 2]
        axes[1].scatter([t["prompt_tokens"] for t in later],
                        [t["cached_tokens"] / t["prompt_tokens"] for t in later], s=18, color=COLORS[variant],
                        label=LABELS[variant])
    axes[0].set(xlabel="turn sent at (s)", ylabel="TTFT (s)", title="TTFT per turn (shaded: the cold paste's prefill)")
    axes[1].set(xlabel="prompt tokens", ylabel="cached share of the prompt", title="turns >= 2: prefix-cache hits",
                ylim=(0, 1.05))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_plot(results: dict, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    panels = [("turns2plus_hit_rate", "prompt-token hit rate, turns >= 2", 1.0),
              ("p99_warm_ttft_during_cold_ms", "p99 warm-turn TTFT during the cold prefill (ms)", None),
              ("edit_median_tpot_ms", "median TPOT of edit turns (ms)", None)]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (key, label, top) in zip(axes, panels):
        names = list(results)
        values = [results[v]["summary"].get(key) or 0 for v in names]
        bars = ax.bar([LABELS[v] for v in names], values, color=[COLORS[v] for v in names])
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom",
                        fontsize=8)
        ax.set_title(label, fontsize=9)
        if top:
            ax.set_ylim(0, top)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_all(case_dir: Path) -> list[Path]:
    written = []
    cpu = load(case_dir, "results_cpu.json")
    if cpu:
        r = next(iter(cpu.values()))
        where = (f"measured on this CPU ({r['hardware'].get('cpu', 'cpu')}, {r['machine_before']['cpu_count']} cores, "
                 f"shared), {r['model']['id']}, commit {r['commit']}")
        turns_plot(cpu, case_dir / "plots" / "cpu_turns.png", where)
        summary_plot(cpu, case_dir / "plots" / "cpu_summary.png", where)
        written += [case_dir / "plots" / "cpu_turns.png", case_dir / "plots" / "cpu_summary.png"]
    sim = load(case_dir, "sim_h200.json")
    if sim:
        r = next(iter(sim.values()))
        summary_plot(sim, case_dir / "plots" / "h200_modelled.png",
                     f"MODELLED (simulator, not measured): 2x {r['gpu']}, llama-3.1-8b, h200 trace, "
                     f"commit {r['commit']}")
        written.append(case_dir / "plots" / "h200_modelled.png")
    return written
