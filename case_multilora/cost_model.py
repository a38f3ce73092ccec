"""Shared multi-LoRA engine vs one dedicated merged replica per tenant: $ per 1M output tokens, the crossover
rate, and GPUs at 10x the tenants. Modelled, not measured (no GPU needed); the throughputs it starts from are
measured H200 figures read from a results file.

    python case_multilora/cost_model.py --json case_multilora/cost_model.json --plot case_multilora/plots/crossover.png

Model. A GPU serves `capacity` output tokens/s at full load and is run at `utilisation` of it (the headroom that
keeps TTFT within the SLO). A dedicated replica serves one tenant's adapter merged into the base weights, so it
runs at the base model's capacity C_base, and a tenant needs ceil(r / (u C_base)) whole GPUs whatever its rate
r (tokens/s). The shared engine serves every tenant's adapter unmerged at C_shared (LoRA's extra work per token
and step), and the pool needs ceil(sum r / (u C_shared)) GPUs.

Per token, a dedicated tenant pays price x ceil(r / (u C_base)) / r and the shared pool price / (u C_shared)
(its rounding spread over every tenant). With C_shared <= C_base the dedicated cost falls below the shared one
at r* = u C_shared: a tenant that alone fills a GPU at the shared engine's rate is cheaper on its own merged
replica; below r* the dedicated GPU idles. `crossover_rate` returns r*, `curve` both costs over r.

Inputs (`CostInputs`): C_base and C_shared from `benchmarks/results/lora_h200_llama8b_c518670.json` (H200,
llama-3.1-8b dummy weights, 240 requests of 256 in / 128 out, SGMV LoRA kernel; base engine 10,759 output
tokens/s, 30 adapters of ranks 8/16/64 10,631: 98.8% of base, measured; the same file's 30 x rank 16 run, 95.8%,
and batch-1 inter-token latency, +12.7% at rank 16, are reported alongside), and the brief's target (90% of
base) as a second shared curve; the H200 price from shared_engine/sim/hardware_profiles/h200.json ($4.00/h,
2026-05); u = 0.7 (an assumption, not measured). Tenant rates: true Zipf over tenants (rate of the k-th most
popular tenant proportional to k^-s, s = 1.1), the total sized so that the brief's 30 tenants fill one shared GPU at the
target, and the same per-tenant distribution at 10x the tenants (300: ten times the total).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

CASE_DIR = Path(__file__).resolve().parent
REPO = CASE_DIR.parent
LORA_RESULTS = REPO / "benchmarks" / "results" / "lora_h200_llama8b_c518670.json"
H200_PROFILE = REPO / "shared_engine" / "sim" / "hardware_profiles" / "h200.json"


@dataclass(frozen=True)
class CostInputs:
    """Throughputs in output tokens/s per GPU, price in USD per GPU-hour, utilisation in (0, 1]."""

    base_capacity: float
    shared_capacity: float
    price_per_hour: float
    utilisation: float = 0.7
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.utilisation <= 1:
            raise ValueError(f"utilisation must be in (0, 1], got {self.utilisation}")
        if not 0 < self.shared_capacity <= self.base_capacity:
            raise ValueError("shared_capacity must be in (0, base_capacity]: an unmerged adapter is never faster")
        if self.price_per_hour <= 0:
            raise ValueError(f"price_per_hour must be positive, got {self.price_per_hour}")


def measured_inputs() -> CostInputs:
    """C_base and C_shared (30 mixed-rank adapters) from the H200 LoRA run; the H200's dated price."""
    runs = json.loads(LORA_RESULTS.read_text())["runs"]
    price = json.loads(H200_PROFILE.read_text())["price_usd_per_hour"]
    return CostInputs(runs["base"]["output_tok_s"], runs["mixed_8_16_64"]["output_tok_s"], price,
                      source=f"{LORA_RESULTS.relative_to(REPO)} (base, mixed_8_16_64); {H200_PROFILE.name}")


def usd_per_million(gpus: float, tokens_per_s: float, price_per_hour: float) -> float:
    return gpus * price_per_hour / (tokens_per_s * 3600) * 1e6


def dedicated_gpus(rate: float, c: CostInputs) -> int:
    """Whole GPUs for one tenant at `rate` tokens/s on merged replicas (at least one)."""
    return max(1, math.ceil(rate / (c.utilisation * c.base_capacity) - 1e-9))


def shared_gpus(total_rate: float, c: CostInputs) -> int:
    return max(1, math.ceil(total_rate / (c.utilisation * c.shared_capacity) - 1e-9))


def dedicated_cost(rate: float, c: CostInputs) -> float:
    """USD per 1M tokens for a tenant at `rate` on its own replicas."""
    return usd_per_million(dedicated_gpus(rate, c), rate, c.price_per_hour)


def shared_cost(c: CostInputs) -> float:
    """USD per 1M tokens on a fully packed shared pool (the marginal cost; rounding of the pool ignored)."""
    return usd_per_million(1, c.utilisation * c.shared_capacity, c.price_per_hour)


def crossover_rate(c: CostInputs) -> float:
    """r* (tokens/s): above it a dedicated merged replica is cheaper per token than the shared pool."""
    return c.utilisation * c.shared_capacity


def zipf_rates(num_tenants: int, total_rate: float, s: float = 1.1) -> list[float]:
    """True Zipf: the k-th most popular tenant's rate is proportional to k^-s (k = 1..N), summing to `total_rate`."""
    weights = [k ** -s for k in range(1, num_tenants + 1)]
    norm = sum(weights)
    return [total_rate * w / norm for w in weights]


def fleet(rates: list[float], c: CostInputs) -> dict:
    """GPUs and $ per 1M tokens for `rates`: all shared, all dedicated, and the hybrid (tenants above r*
    dedicated, the rest shared)."""
    total = sum(rates)
    heavy = [r for r in rates if r > crossover_rate(c)]
    light = total - sum(heavy)
    plans = {"shared": shared_gpus(total, c), "dedicated": sum(dedicated_gpus(r, c) for r in rates),
             "hybrid": sum(dedicated_gpus(r, c) for r in heavy) + (shared_gpus(light, c) if light > 0 else 0)}
    return {"num_tenants": len(rates), "total_rate_tok_s": round(total, 1), "num_dedicated_in_hybrid": len(heavy),
            **{f"{k}_gpus": v for k, v in plans.items()},
            **{f"{k}_usd_per_1m": round(usd_per_million(v, total, c.price_per_hour), 4) for k, v in plans.items()}}


def curve(c: CostInputs, rates: list[float]) -> list[dict]:
    return [{"rate_tok_s": r, "dedicated_usd_per_1m": dedicated_cost(r, c), "shared_usd_per_1m": shared_cost(c)}
            for r in rates]


def measured_context() -> dict:
    """The LoRA results file's other figures, reported next to the model (not inputs to it): commit, the
    30 x rank-16 run's share of base, batch-1 inter-token latency of base and rank 16 (ms)."""
    data = json.loads(LORA_RESULTS.read_text())
    runs, itl = data["runs"], data["itl_ms"]
    return {"file": str(LORA_RESULTS.relative_to(REPO)), "commit": data["environment"]["commit"],
            "gpu": data["environment"]["hardware"]["gpu"], "lora_kernel": data["engine_config"].get("lora_kernel"),
            "mixed_8_16_64_vs_base": runs["mixed_8_16_64"]["vs_base"], "r16x30_vs_base": runs["r16x30"]["vs_base"],
            "itl_ms_batch1_base": itl["base"], "itl_ms_batch1_r16": itl["lora_r16"],
            "itl_r16_overhead_vs_base": itl["r16_overhead_vs_base"]}


def report(c: CostInputs, target_share: float = 0.9, num_tenants: int = 30, s: float = 1.1) -> dict:
    """Measured and target shared capacity: crossover, costs, fleets at the brief's tenants and at 10x."""
    target = replace(c, shared_capacity=target_share * c.base_capacity, source=f"{target_share:.0%} of base (target)")
    total = target.utilisation * target.shared_capacity  # 30 tenants fill one shared GPU at the target
    out = {"inputs": asdict(c), "zipf_s": s, "brief_total_rate_tok_s": round(total, 1), "cases": {}}
    for name, inputs in (("measured", c), ("target", target)):
        out["cases"][name] = {
            "shared_capacity_tok_s": inputs.shared_capacity, "crossover_rate_tok_s": round(crossover_rate(inputs), 1),
            "shared_usd_per_1m": round(shared_cost(inputs), 4),
            "dedicated_usd_per_1m_at_mean_rate": round(dedicated_cost(total / num_tenants, inputs), 4),
            "brief": fleet(zipf_rates(num_tenants, total, s), inputs),
            "x10": fleet(zipf_rates(10 * num_tenants, 10 * total, s), inputs)}
    return out


def plot(c: CostInputs, out: dict, path: Path, provenance: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [10 ** (k / 40) for k in range(40, 40 * 5 + 1)]  # 10 .. 100,000 tokens/s
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.plot(rates, [dedicated_cost(r, c) for r in rates], label="dedicated merged replica (per tenant)")
    for name, style in (("measured", "--"), ("target", ":")):
        case = out["cases"][name]
        shared = replace(c, shared_capacity=case["shared_capacity_tok_s"])
        ax.axhline(shared_cost(shared), linestyle=style, color="C1" if name == "measured" else "C2",
                   label=f"shared engine, {name} ({shared.shared_capacity / c.base_capacity:.0%} of base)")
        ax.axvline(crossover_rate(shared), linestyle=style, color="grey", linewidth=0.8)
        ax.annotate(f"r* = {crossover_rate(shared):,.0f} tok/s", (crossover_rate(shared), shared_cost(shared)),
                    textcoords="offset points", xytext=(5, 8), fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="one tenant's output rate (tokens/s)", ylabel="USD per 1M output tokens",
           title="Shared multi-LoRA vs dedicated replica, H200, llama-3.1-8b (modelled from measured throughput)"
           + (f"\n{provenance}" if provenance else ""))
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--utilisation", type=float, default=0.7)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    inputs = replace(measured_inputs(), utilisation=args.utilisation)
    out = report(inputs)
    out["measured_context"] = measured_context()
    out["command"] = "python case_multilora/cost_model.py" + (f" --json {args.json}" if args.json else "") + (
        f" --plot {args.plot}" if args.plot else "")
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if args.plot:
        ctx = out["measured_context"]
        plot(inputs, out, args.plot, f"from {Path(ctx['file']).name} ({ctx['lora_kernel']}, commit {ctx['commit']}); "
             "python case_multilora/cost_model.py")


if __name__ == "__main__":
    main()
