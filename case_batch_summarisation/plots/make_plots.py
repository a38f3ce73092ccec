"""Plots from the results files (first attempt vs the fix on this CPU; the fix on the H200; the cost model's
GPUs per night). Needs matplotlib (`pip install '.[sim]'`).

    python case_batch_summarisation/plots/make_plots.py
"""

from __future__ import annotations

import json
from pathlib import Path

CASE = Path(__file__).resolve().parents[1]


def load(rel: str) -> dict | None:
    path = CASE / rel
    return json.loads(path.read_text()) if path.exists() else None


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, fix = load("first_attempt/results_cpu.json"), load("the_fix/results_cpu.json")
    if first and fix:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        names = ["first attempt\n(server, 4 at a time)", "the fix\n(run-batch, all at once)"]
        for ax, key, label in ((axes[0], "tickets_per_s", "tickets/s"),
                               (axes[1], "output_tokens_per_s", "output tokens/s")):
            bars = ax.bar(names, [first[key], fix[key]], color=["#c44", "#4a4"])
            ax.bar_label(bars, fmt="%.2f")
            ax.set_ylabel(label)
        commit = str(fix.get("commit", "?"))[:7]
        fig.suptitle(f"{fix['num_tickets']} tickets, SmolLM2-135M-Instruct, 2-core CPU (commit {commit})")
        fig.tight_layout()
        fig.savefig(CASE / "plots" / "first_vs_fix_cpu.png", dpi=110)
    cost = load("cost_model.json")
    if cost:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        gpus = list(cost["gpus"])
        one = [cost["gpus"][g]["1x"]["gpus"] for g in gpus]
        ten = [cost["gpus"][g]["10x"]["gpus"] for g in gpus]
        x = range(len(gpus))
        b1 = ax.bar([i - 0.2 for i in x], one, 0.4, label="2M tickets / 8 h")
        b2 = ax.bar([i + 0.2 for i in x], ten, 0.4, label="20M (10x)")
        ax.bar_label(b1)
        ax.bar_label(b2)
        ax.set_xticks(list(x), [cost["gpus"][g]["simulated"]["gpu"] for g in gpus])
        ax.set_ylabel("GPUs for the window (modelled)")
        ax.set_yscale("log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(CASE / "plots" / "gpus_per_night.png", dpi=110)


if __name__ == "__main__":
    main()
