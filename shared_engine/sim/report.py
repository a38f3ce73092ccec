"""Render a capacity report: a text table (the `vllm bench serve` block's fields), JSON, an optional PNG.

A report is a plain dict built by `__main__`: `inputs` (hardware, model, engine config, workload), and one
section per scenario (`baseline`, `traffic_10x`), each with `summary` (`SimMetrics.summary()`), `cost`
(`cost.cost_summary`) and, when the workload names an SLO, `fewest_replicas_for_slo`. Every figure is
modelled, not measured, and the header says so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

_ROWS = [
    ("Successful requests", "completed", "{:,.0f}"),
    ("Duration (s)", "duration_s", "{:,.1f}"),
    ("Total input tokens", "total_input_tokens", "{:,.0f}"),
    ("Total generated tokens", "total_output_tokens", "{:,.0f}"),
    ("Request throughput (req/s)", "request_throughput", "{:,.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:,.1f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:,.1f}"),
]
_LATENCIES = [("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E latency", "e2el")]
_ENGINE_ROWS = [
    ("Replicas", "num_replicas", "{:,.0f}"),
    ("KV blocks per replica", "num_kv_blocks_per_replica", "{:,.0f}"),
    ("Utilisation (busy share)", "utilisation", "{:.1%}"),
    ("KV cache usage mean / max", None, None),
    ("Preemptions", "num_preemptions", "{:,.0f}"),
    ("Prefix cache hit rate", "prefix_cache_hit_rate", "{:.1%}"),
    ("Engine steps", "num_steps", "{:,.0f}"),
]
_COST_ROWS = [
    ("GPU $/hour (dated input)", "gpu_usd_per_hour", "{:,.3f}"),
    ("Fleet cost for the run ($)", "fleet_usd", "{:,.4f}"),
    ("$ per 1M output tokens", "usd_per_1m_output_tokens", "{:,.4f}"),
    ("$ per 1M total tokens", "usd_per_1m_total_tokens", "{:,.4f}"),
    ("API cost for the same tokens ($)", "api_usd", "{:,.4f}"),
    ("Self-hosted / API cost", "self_hosted_over_api", "{:,.2f}"),
    ("Break-even request rate (req/s)", "break_even_request_rate", "{:,.2f}"),
    ("Break-even share of this traffic", "break_even_traffic_share", "{:.1%}"),
]


def _fmt(fmt: str, value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return fmt.format(value)


def section_text(title: str, section: dict) -> str:
    s, c = section["summary"], section.get("cost", {})
    lines = [f"{'=' * 20} {title} {'=' * 20}"]
    lines += [f"{label:<40}{_fmt(fmt, s.get(key))}" for label, key, fmt in _ROWS]
    for label, key in _LATENCIES:
        lines.append(f"{'-' * 14}{label}{'-' * 14}")
        for stat in ("mean", "median", "p99"):
            name = f"{stat.capitalize()} {key.upper()} (ms)"
            lines.append(f"{name:<40}{_fmt('{:,.2f}', s[f'{stat}_{key}_ms'])}")
    lines.append(f"{'-' * 14}Engine{'-' * 14}")
    for label, key, fmt in _ENGINE_ROWS:
        if key is None:
            value = f"{s['kv_cache_usage_mean']:.1%} / {s['kv_cache_usage_max']:.1%}"
        else:
            value = _fmt(fmt, s.get(key))
        lines.append(f"{label:<40}{value}")
    if c:
        lines.append(f"{'-' * 14}Cost{'-' * 14}")
        lines += [f"{label:<40}{_fmt(fmt, c.get(key))}" for label, key, fmt in _COST_ROWS if key in c]
    slo = section.get("fewest_replicas_for_slo")
    if slo is not None:
        replicas = "not met up to the search limit" if slo["replicas"] is None else f"{slo['replicas']}"
        lines.append(f"Fewest replicas meeting {_slo_text(slo['slo'])}: {replicas} "
                     f"(search probes of {slo['probe_requests']} requests)")
    return "\n".join(lines)


def _slo_text(slo: dict) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in slo.items())


def to_text(report: dict) -> str:
    i = report["inputs"]
    head = [f"Capacity model (modelled, not measured): {i['model']} on {i['hardware']['name']} "
            f"({i['dtype']}), workload {i['workload']['name']}, simulated in {report['wall_s']:.1f} s"]
    head.append(f"Step times: fractions {i['hardware'].get('fraction_source') or 'as given'}; overheads "
                f"{i['hardware'].get('overhead_source') or 'as given'}")
    if i["hardware"].get("price_date"):
        head.append(f"GPU price {i['hardware']['price_usd_per_hour']} $/h as of {i['hardware']['price_date']} "
                    f"({i['hardware']['price_source']})")
    sections = [section_text(name.replace("_", " "), report[name]) for name in ("baseline", "traffic_10x")
                if name in report]
    return "\n".join(head) + "\n" + "\n\n".join(sections) + "\n"


def write_json(report: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")


def write_png(report: dict, path: str | Path) -> bool:
    """Latency percentiles, baseline vs 10x traffic. Returns False (and writes nothing) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [n for n in ("baseline", "traffic_10x") if n in report]
    fig, axes = plt.subplots(1, len(_LATENCIES), figsize=(4 * len(_LATENCIES), 3.5))
    for ax, (label, key) in zip(axes, _LATENCIES):
        for offset, name in enumerate(names):
            s = report[name]["summary"]
            values = [s[f"{stat}_{key}_ms"] for stat in ("median", "p90", "p99")]
            ax.bar([x + 0.4 * offset for x in range(3)], values, width=0.4, label=name)
        ax.set_xticks([0.2, 1.2, 2.2], ["p50", "p90", "p99"])
        ax.set_title(f"{label} (ms)")
    axes[0].legend()
    fig.suptitle(f"Modelled: {report['inputs']['model']} on {report['inputs']['hardware']['name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
