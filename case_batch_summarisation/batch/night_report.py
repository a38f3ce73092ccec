"""The night's report from the shards' done records and the validation counts: rows, tokens, throughput,
GPU-hours and cost. Standard library only (the Airflow report task).

GPU-hours: each shard worker holds one GPU for its whole wall time (model load included), so GPU-hours =
sum of the workers' wall seconds / 3600 x GPUs per worker; cost = GPU-hours x `gpu_hour_usd` (default: the
H200 hardware profile's dated price, shared_engine/sim/hardware_profiles/h200.json, or the folder that
`BATCH_HARDWARE_PROFILES` names: the Airflow image has the case, not the engine's source tree).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PROFILES = Path(os.environ.get("BATCH_HARDWARE_PROFILES")
                or Path(__file__).resolve().parents[2] / "shared_engine" / "sim" / "hardware_profiles")


def gpu_price(gpu: str = "h200") -> tuple[float, str]:
    """($/hour, where the figure comes from) of a hardware profile."""
    d = json.loads((PROFILES / f"{gpu}.json").read_text())
    return d["price_usd_per_hour"], f"{d['price_source']} ({d['price_date']})"


def night_report(records: list[dict], validation: dict, gpu_hour_usd: float | None = None,
                 gpus_per_worker: int = 1) -> dict:
    """`records`: the shard workers' done records (worker.py); `validation`: summed `validate_output_rows`."""
    price, source = gpu_price() if gpu_hour_usd is None else (gpu_hour_usd, "given")
    s = [r["summary"] for r in records]
    total = {k: sum(x[k] for x in s) for k in ("num_rows", "num_succeeded", "num_failed", "prompt_tokens",
                                                "prefill_tokens", "cached_prompt_tokens", "completion_tokens")}
    engine_s = sum(x["elapsed_s"] for x in s)
    wall_s = sum(r["wall_s"] for r in records)
    gpu_hours = wall_s * gpus_per_worker / 3600
    return {
        "num_shards": len(records), "num_shards_skipped": sum(bool(r.get("skipped")) for r in records), **total,
        "summaries_valid": validation.get("summaries_valid", 0),
        "summaries_invalid": validation.get("summaries_invalid", 0),
        "summary_problems": validation.get("problems", {}),
        "engine_seconds": engine_s, "worker_wall_seconds": wall_s,
        "output_tokens_per_engine_s": total["completion_tokens"] / engine_s if engine_s else 0.0,
        "prompt_tokens_per_engine_s": total["prompt_tokens"] / engine_s if engine_s else 0.0,
        "rows_per_engine_s": total["num_rows"] / engine_s if engine_s else 0.0,
        "prefix_cache_hit_share": total["cached_prompt_tokens"] / total["prompt_tokens"]
        if total["prompt_tokens"] else 0.0,
        "gpu_hours": gpu_hours, "gpu_hour_usd": price, "gpu_price_source": source,
        "cost_usd": gpu_hours * price,
        "usd_per_million_tokens": gpu_hours * price / ((total["prompt_tokens"] + total["completion_tokens"]) / 1e6)
        if total["prompt_tokens"] else None,
        "workers": sorted({f"{r.get('host')}:gpu{r.get('gpu')}" for r in records}),
    }
