"""PNGs of first attempt vs fix, from the results files (`report.py` calls this; needs matplotlib).

Per profile with results: `latency_<profile>.png` (TTFT and ITL distributions with the targets) and
`engine_<profile>.png` (what the engine's own metrics showed: `vllm:num_requests_waiting` and KV usage over
the run, and the step composition from `vllm:iteration_tokens_total`).
"""

from __future__ import annotations

import json
from pathlib import Path

COLORS = {"first_attempt": "#c0392b", "the_fix": "#1f77b4"}
LABELS = {"first_attempt": "first attempt", "the_fix": "the fix"}


def _results(case_dir: Path, profile: str) -> dict:
    out = {}
    for variant in COLORS:
        path = case_dir / variant / f"results_{profile}.json"
        if path.exists():
            out[variant] = json.loads(path.read_text())
    return out


def _cdf(ax, quantiles: list[float], color: str, label: str) -> None:
    if quantiles:
        n = len(quantiles)
        ax.plot(quantiles, [i / (n - 1) for i in range(n)], color=color, label=label)


def latency_plot(results: dict, profile: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    targets = next(iter(results.values()))["targets"]
    for ax, key, target, title in ((axes[0], "ttft_quantiles_ms", targets["p95_ttft_ms"], "TTFT"),
                                   (axes[1], "itl_quantiles_ms", targets["p95_itl_ms"], "ITL")):
        for variant, r in results.items():
            _cdf(ax, r["summary"][key], COLORS[variant], LABELS[variant])
        ax.axvline(target, color="k", ls="--", lw=1, label=f"p95 target {target:,} ms")
        ax.axhline(0.95, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} (ms, log scale)")
        ax.set_ylabel("share of samples")
        ax.set_title(f"{title} distribution")
        ax.legend(fontsize=8)
    fig.suptitle(_title(results, profile), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def engine_plot(results: dict, profile: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for variant, r in results.items():
        ts = r["timeseries"]
        kw = {"color": COLORS[variant], "label": LABELS[variant]}
        axes[0].plot(ts["t_s"], ts["vllm:num_requests_waiting"], **kw)
        axes[1].plot(ts["t_s"], [100 * u for u in ts["vllm:kv_cache_usage_perc"]], **kw)
        steps = r["summary"]["engine"]["steps_by_tokens_le"]
        bounds = [b for b in steps if b != "+Inf"]
        total = sum(steps.values()) or 1.0
        offset = -0.2 if variant == "first_attempt" else 0.2
        axes[2].bar([i + offset for i in range(len(bounds))], [100 * steps[b] / total for b in bounds], width=0.4,
                    **kw)
        axes[2].set_xticks(range(len(bounds)), [str(int(float(b))) for b in bounds], rotation=90, fontsize=7)
    load = next(iter(results.values()))["load"]
    for ax in axes[:2]:
        ax.axvspan(load["warmup_s"], load["warmup_s"] + load["duration_s"], color="grey", alpha=0.1,
                   label="measured window")
        ax.set_xlabel("seconds since the run started")
    axes[0].set_title("vllm:num_requests_waiting")
    axes[1].set_title("vllm:kv_cache_usage_perc (%)")
    axes[2].set_title("engine steps by tokens per step (%)")
    axes[2].set_xlabel("tokens in the step, up to (vllm:iteration_tokens_total bucket)")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(_title(results, profile), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _title(results: dict, profile: str) -> str:
    r = next(iter(results.values()))
    hw = r["hardware"].get("gpu") or f"{r['hardware'].get('cpu')} ({r['hardware'].get('cpu_cores')} cores)"
    model = r["model"].get("root") or r["model"].get("id")
    commits = sorted({x["commit"][:12] for x in results.values()})
    return f"{profile}: {hw}, {model}, {r['load']['users']} users; measured, commit {', '.join(commits)}"


def make_all(case_dir: Path) -> list[Path]:
    """Write every plot whose results exist; returns the files written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        return []
    written = []
    for profile in ("cpu", "h200"):
        results = _results(case_dir, profile)
        if not results:
            continue
        for name, fn in (("latency", latency_plot), ("engine", engine_plot)):
            path = case_dir / "plots" / f"{name}_{profile}.png"
            fn(results, profile, path)
            written.append(path)
    return written
