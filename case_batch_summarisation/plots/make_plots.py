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


def cpu_bars() -> list[tuple[str, float, float]]:
    """(label, tickets/s, output tokens/s) of each CPU results file present, its ticket count in the label. The
    DAG runs' rates are over the shards' engine seconds (run-batch's elapsed time: model load excluded, like
    the other bars)."""
    bars = []
    for rel, label in (("first_attempt/results_cpu.json", "first attempt, host\n(server, 4 at a time)"),
                       ("the_fix/results_cpu.json", "the fix, host\n(run-batch)"),
                       ("first_attempt/results_compose_cpu.json", "first attempt, compose\n(engine, 4 at a time)")):
        if r := load(rel):
            bars.append((f"{label}\n{r['num_tickets']} tickets", r["tickets_per_s"], r["output_tokens_per_s"]))
    for rel, label in (("the_fix/dag_test_cpu_32.json", "the fix, dag.test\n(run-batch per shard)"),
                       ("the_fix/dag_test_cpu_200.json", "the fix, dag.test\n(2 shards of 100)"),
                       ("the_fix/results_compose_cpu.json", "the fix, compose\n(Airflow DAG)")):
        r = load(rel)
        report = r and (r.get("report") or (r.get("runs") or [{}])[0].get("report"))
        if report and report.get("engine_seconds"):
            bars.append((f"{label}\n{report['num_rows']} tickets", report["num_rows"] / report["engine_seconds"],
                         report["completion_tokens"] / report["engine_seconds"]))
    return bars


def compose_200_bars() -> list[tuple[str, float, float]] | None:
    """(label, tickets/s, output tokens/s) of the 200-ticket compose runs (schema-constrained summaries, up to
    160 tokens): the first attempt over the tickets it answered before its deadline, the fix over the shards'
    engine seconds and over the whole DAG run. None until both files exist."""
    first, fix = load("first_attempt/results_compose_cpu_200.json"), load("the_fix/results_compose_cpu_200.json")
    if not (first and fix and fix.get("report")):
        return None
    rep = fix["report"]
    return [(f"first attempt\n(engine, 4 at a time)\n{first['num_tickets']} tickets", first["tickets_per_s"],
             first["output_tokens_per_s"]),
            (f"the fix, engine time\n(run-batch per shard)\n{rep['num_rows']} tickets",
             rep["num_rows"] / rep["engine_seconds"], rep["completion_tokens"] / rep["engine_seconds"]),
            (f"the fix, whole DAG run\n(Airflow, 2 engine starts)\n{rep['num_rows']} tickets",
             rep["num_rows"] / fix["dag_run_s"], rep["completion_tokens"] / fix["dag_run_s"])]


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = cpu_bars()
    if bars:
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        names = [b[0] for b in bars]
        colors = ["#c44" if "first" in n else "#4a4" for n in names]
        for ax, i, label in ((axes[0], 1, "tickets/s (engine time)"), (axes[1], 2, "output tokens/s (engine time)")):
            drawn = ax.bar(names, [b[i] for b in bars], color=colors)
            ax.bar_label(drawn, fmt="%.2f")
            ax.set_ylabel(label)
            ax.tick_params(axis="x", labelsize=7)
        fig.suptitle("SmolLM2-135M-Instruct on a shared 2-core CPU: host runs (60 tickets, commit 728158f) and "
                     "compose / dag.test runs (32 and 200 tickets, commit ad7f84b); files in first_attempt/, the_fix/",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(CASE / "plots" / "first_vs_fix_cpu.png", dpi=110)
    bars = compose_200_bars()
    if bars:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, i, label in ((axes[0], 1, "tickets/s"), (axes[1], 2, "output tokens/s")):
            drawn = ax.bar([b[0] for b in bars], [b[i] for b in bars], color=["#c44", "#4a4", "#8c8"])
            ax.bar_label(drawn, fmt="%.3f" if i == 1 else "%.1f")
            ax.set_ylabel(label)
            ax.tick_params(axis="x", labelsize=7)
        fix = load("the_fix/results_compose_cpu_200.json")
        fig.suptitle(f"Compose, SmolLM2-135M-Instruct, shared 2-core CPU, JSON-constrained summaries (commit "
                     f"{str(fix.get('commit', '?'))[:7]}): the_fix/ and first_attempt/results_compose_cpu_200.json",
                     fontsize=8)
        fig.tight_layout()
        fig.savefig(CASE / "plots" / "first_vs_fix_compose_200.png", dpi=110)
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
