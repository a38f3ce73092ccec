"""Fit a hardware profile's achieved fractions and overheads to a recorded step profile.

`scripts/profile_steps.py` records, for every engine step, what was scheduled (`[start, n, needs_sample]`
per request) and the step's wall time, plus the device's measured copy bandwidth and matmul rate. Here we
search the achieved bandwidth and matmul fractions on a grid and, for each pair, solve the two overheads
(per step, per sequence) by weighted least squares on relative error; the pair (and combine rule, `max` or
`sum`) with the smallest median relative error wins. Steps more than 3 median absolute deviations off the
first fit are dropped once (other jobs share this machine's two cores and produce slow outliers).
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from shared_engine.model_arch import ModelArch
from shared_engine.sim.hardware import HardwareProfile
from shared_engine.sim.step_time import StepShape, item_totals

_GRID = np.geomspace(0.02, 1.0, 36)


@dataclasses.dataclass(frozen=True)
class StepFit:
    bandwidth_fraction: float
    matmul_fraction: float
    step_overhead_s: float
    per_seq_overhead_s: float
    combine: str
    median_rel_error: float
    p90_rel_error: float
    num_steps: int
    num_outliers: int


def profile_features(profile: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, FLOPs, num_seqs, seconds) per recorded step, for the profiled model and dtype."""
    shape = StepShape.from_arch(ModelArch.from_dict(profile["model_config"]), profile["dtype"])
    totals = np.array([item_totals(step["items"]) for step in profile["steps"]], dtype=float)
    moved, flops = shape.bytes_and_flops(totals[:, 1], totals[:, 2], totals[:, 3], totals[:, 4])
    seconds = np.array([step["seconds"] for step in profile["steps"]])
    return moved, flops, totals[:, 0], seconds


def fit_steps(moved, flops, num_seqs, seconds, bandwidth: float, matmul_flops: float) -> StepFit:
    """Best fit over the grid; `bandwidth` and `matmul_flops` are the peaks the fractions scale."""
    keep = np.ones(len(seconds), dtype=bool)
    best = _search(moved, flops, num_seqs, seconds, bandwidth, matmul_flops, keep)
    rel = _rel_errors(best, moved, flops, num_seqs, seconds, bandwidth, matmul_flops)
    mad = np.median(np.abs(rel - np.median(rel)))
    keep = np.abs(rel - np.median(rel)) <= 3 * max(mad, 1e-3)
    best = _search(moved, flops, num_seqs, seconds, bandwidth, matmul_flops, keep)
    rel = np.abs(_rel_errors(best, moved, flops, num_seqs, seconds, bandwidth, matmul_flops))[keep]
    return dataclasses.replace(best, median_rel_error=float(np.median(rel)),
                               p90_rel_error=float(np.percentile(rel, 90)), num_steps=int(keep.sum()),
                               num_outliers=int((~keep).sum()))


def _search(moved, flops, num_seqs, seconds, bandwidth, matmul_flops, keep) -> StepFit:
    m, f, s, t = moved[keep], flops[keep], num_seqs[keep], seconds[keep]
    best, best_err = None, np.inf
    for combine in ("max", "sum"):
        for fb in _GRID:
            mem = m / (bandwidth * fb)
            for ff in _GRID:
                compute = f / (matmul_flops * ff)
                body = np.maximum(mem, compute) if combine == "max" else mem + compute
                a, b = _overheads(t - body, s, t)
                err = np.median(np.abs(body + a + b * s - t) / t)
                if err < best_err:
                    best_err = err
                    best = StepFit(float(fb), float(ff), a, b, combine, float(err), 0.0, len(t), 0)
    return best


def _overheads(residual, num_seqs, seconds) -> tuple[float, float]:
    """Non-negative (a, b) minimising sum(((a + b*num_seqs - residual) / seconds)^2)."""
    w = 1.0 / seconds
    design = np.stack([w, w * num_seqs], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, residual * w, rcond=None)
    w2 = w * w
    if a < 0:  # pin the negative term at zero and refit the other alone
        a, b = 0.0, max(0.0, float(np.sum(w2 * num_seqs * residual) / np.sum(w2 * num_seqs**2)))
    elif b < 0:
        a, b = max(0.0, float(np.sum(w2 * residual) / np.sum(w2))), 0.0
    return float(a), float(b)


def _rel_errors(fit: StepFit, moved, flops, num_seqs, seconds, bandwidth, matmul_flops) -> np.ndarray:
    mem = moved / (bandwidth * fit.bandwidth_fraction)
    compute = flops / (matmul_flops * fit.matmul_fraction)
    body = np.maximum(mem, compute) if fit.combine == "max" else mem + compute
    return (body + fit.step_overhead_s + fit.per_seq_overhead_s * num_seqs - seconds) / seconds


@lru_cache(maxsize=None)
def _load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def calibrated(hardware: HardwareProfile, path: Path) -> HardwareProfile:
    """`hardware` with fractions, overheads and combine rule fitted to the step profile at `path`.

    A CPU profile also takes its peaks from the profile's measured ceilings (a CPU has no datasheet
    figure for what one process can reach); a GPU keeps its datasheet peaks.
    """
    profile = _load(str(path))
    bandwidth, matmul = hardware.memory_bandwidth, hardware.matmul_flops
    if hardware.kind == "cpu":
        bandwidth = profile["ceilings"]["copy_bytes_per_s"]
        matmul = profile["ceilings"]["matmul_flops_per_s"]
    fit = fit_steps(*profile_features(profile), bandwidth, matmul)
    return dataclasses.replace(
        hardware, memory_bandwidth=bandwidth, matmul_flops=matmul, bandwidth_fraction=fit.bandwidth_fraction,
        matmul_fraction=fit.matmul_fraction, step_overhead_s=fit.step_overhead_s,
        per_seq_overhead_s=fit.per_seq_overhead_s, combine=fit.combine,
        fraction_source=f"fitted to {path.name} ({fit.num_steps} steps, {profile['model']}, {profile['dtype']})",
        overhead_source=f"fitted to {path.name}",
        calibration_error={"median_rel_error": fit.median_rel_error, "p90_rel_error": fit.p90_rel_error,
                           "num_steps": fit.num_steps, "num_outliers": fit.num_outliers},
    )
