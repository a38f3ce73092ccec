"""Fit a hardware profile's achieved fractions and overheads to a recorded step profile.

`scripts/profile_steps.py` records, for every engine step, what was scheduled (`[start, n, needs_sample]`
per request) and the step's wall time, plus the device's measured copy bandwidth and matmul rate. The fit
minimises relative error, with the hardware profile's combine rule:

- `sum` (no overlap, the CPU): step time is linear in (num_seqs, bytes, matmul FLOPs, attention FLOPs), so
  the per-sequence overhead and the three inverse rates come from one non-negative least-squares solve.
  Weight bytes are the same every step for one model, so a per-step overhead cannot be told apart from
  weight streaming; it is folded into the latter (step_overhead_s = 0).
- `phases` (GPUs; a roofline for the GEMMs plus one for attention, step_time.py) and `max` (one roofline
  over the step): the bandwidth and matmul fractions are searched on a grid (attention at the
  matmul fraction), then on two finer grids around the best pair (a coarse grid step of 12% moved offline
  predictions by about 4%), and the two overheads solved by least squares for each pair. The pair kept is the
  one with the least *mean* absolute relative error. Not the median: a profile's scenarios decide its step
  mix, and when one kind of step is more than half of it the median is set by that kind alone. The H200
  qwen3-0.6b profile (max_model_len 2048, budget 8192) is 52% eager 8k-token prefill steps (241 of 460),
  which are compute-bound and say nothing about bandwidth: the median fit left the bandwidth fraction free
  (0.23 of 4.8 TB/s, where its pure decode steps read KV at about 3.4 TB/s), dropped 87 of its 196 decode
  steps as outliers, and predicted the offline run, 98% decode steps, at half its measured throughput.

Steps more than 3 median absolute deviations off the first fit are dropped once (other jobs share this
machine's two cores and produce slow outliers); the fit quality is reported with the result.

Host and device apart: a GPU profile whose steps also record `gpu_seconds` (the device's span of the step,
CUDA events; `scripts/profile_steps.py` since 064cdd6) is fitted twice. The fractions and the *device*
overheads are fitted to the GPU spans, the *host* overheads (a + b * num_seqs, non-negative least squares,
one outlier pass) to the rest of each step (wall - GPU span). The simulator needs the split for async
scheduling, where the host's part runs under the device's (step_time.py). Without GPU spans the whole
step is fitted as before and the device overheads are 0.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import numpy as np

from shared_engine.model_arch import ModelArch
from shared_engine.sim.hardware import HardwareProfile, hardware_key
from shared_engine.sim.step_time import StepShape, item_totals

_GRID = np.geomspace(0.02, 1.0, 36)  # 12% apart
_REFINE_ROUNDS, _REFINE_POINTS = 2, 9


@dataclasses.dataclass(frozen=True)
class StepFit:
    bandwidth_fraction: float
    matmul_fraction: float
    attention_fraction: float
    step_overhead_s: float
    per_seq_overhead_s: float
    median_rel_error: float = 0.0
    p90_rel_error: float = 0.0
    num_steps: int = 0
    num_outliers: int = 0

    def predict(self, features: np.ndarray, bandwidth: float, matmul: float, combine: str,
                weight_bytes: float = 0.0) -> np.ndarray:
        """Step seconds (step_time.py's rules); `weight_bytes` (per step, in `moved`) splits the phases."""
        seqs, moved, mm, att = features
        bw = bandwidth * self.bandwidth_fraction
        if combine == "phases":
            gemm = np.maximum(weight_bytes / bw, mm / (matmul * self.matmul_fraction))
            body = gemm + np.maximum((moved - weight_bytes) / bw, att / (matmul * self.attention_fraction))
        else:
            mem = moved / bw
            compute = mm / (matmul * self.matmul_fraction) + att / (matmul * self.attention_fraction)
            body = mem + compute if combine == "sum" else np.maximum(mem, compute)
        return self.step_overhead_s + self.per_seq_overhead_s * seqs + body


def gpu_seconds(profile: dict) -> np.ndarray | None:
    """Each step's GPU span (seconds), or None when the profile does not record it for every step."""
    spans = [step.get("gpu_seconds") for step in profile["steps"]]
    return None if any(s is None for s in spans) else np.array(spans, dtype=float)


@dataclasses.dataclass(frozen=True)
class HostFit:
    """The host's share of a step: `step_overhead_s + per_seq_overhead_s * num_seqs` (seconds)."""

    step_overhead_s: float
    per_seq_overhead_s: float
    median_rel_error: float  # of the fitted host time against the measured (wall - GPU span)
    num_outliers: int


def _inliers(rel: np.ndarray) -> np.ndarray:
    """Mask of the steps within 3 median absolute deviations (at least 0.3%) of the median relative error."""
    dev = np.abs(rel - np.median(rel))
    return dev <= 3 * max(float(np.median(dev)), 1e-3)


def fit_host(num_seqs: np.ndarray, host_seconds: np.ndarray) -> HostFit:
    """Non-negative (a, b) minimising the relative error of a + b * num_seqs against `host_seconds`
    (each > 0), refitted once without the steps more than 3 median absolute deviations off."""
    def solve(mask):
        return _overheads(host_seconds[mask], num_seqs[mask], host_seconds[mask])

    keep = np.ones(len(host_seconds), dtype=bool)
    a, b = solve(keep)
    keep = _inliers((a + b * num_seqs) / host_seconds - 1.0)
    a, b = solve(keep)
    rel = np.abs((a + b * num_seqs) / host_seconds - 1.0)[keep]
    return HostFit(a, b, float(np.median(rel)), int((~keep).sum()))


def profile_features(profile: dict) -> tuple[np.ndarray, np.ndarray]:
    """([num_seqs, bytes, matmul FLOPs, attention FLOPs] per step, seconds per step)."""
    shape = StepShape.from_arch(ModelArch.from_dict(profile["model_config"]), profile["dtype"])
    totals = np.array([item_totals(step["items"]) for step in profile["steps"]], dtype=float)
    moved, mm, att = shape.bytes_and_flops(totals[:, 1], totals[:, 2], totals[:, 3], totals[:, 4])
    seconds = np.array([step["seconds"] for step in profile["steps"]])
    return np.stack([totals[:, 0], moved, mm, att]), seconds


def fit_steps(features: np.ndarray, seconds: np.ndarray, bandwidth: float, matmul: float, combine: str,
              weight_bytes: float = 0.0) -> StepFit:
    """Best fit; `bandwidth` and `matmul` are the peaks (bytes/s, FLOP/s) the fractions scale; `weight_bytes`
    (the model's, read once per step) is needed by the `phases` rule."""
    if combine == "sum":
        solve = _fit_sum
    else:
        def solve(f, s, bw, mm):
            return _fit_grid(f, s, bw, mm, combine, weight_bytes)
    fit = solve(features, seconds, bandwidth, matmul)
    rel = fit.predict(features, bandwidth, matmul, combine, weight_bytes) / seconds - 1.0
    keep = _inliers(rel)
    fit = solve(features[:, keep], seconds[keep], bandwidth, matmul)
    rel = np.abs(fit.predict(features, bandwidth, matmul, combine, weight_bytes) / seconds - 1.0)[keep]
    return dataclasses.replace(fit, median_rel_error=float(np.median(rel)), p90_rel_error=float(np.percentile(rel, 90)),
                               num_steps=int(keep.sum()), num_outliers=int((~keep).sum()))


def _fit_sum(features, seconds, bandwidth, matmul) -> StepFit:
    scale = np.array([1.0, 1.0 / bandwidth, 1.0 / matmul, 1.0 / matmul])
    coef = _nnls(features.T * scale / seconds[:, None], np.ones_like(seconds))
    inv = np.maximum(coef[1:], 1e-12)  # a zero coefficient: that term never mattered, any rate fits
    return StepFit(float(1 / inv[0]), float(1 / inv[1]), float(1 / inv[2]), 0.0, float(coef[0]))


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (drop the most negative, re-solve; a few columns only)."""
    active = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        coef[active], *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if coef.min() >= 0:
            return coef
        active.remove(int(np.argmin(coef)))


def _fit_grid(features, seconds, bandwidth, matmul, combine, weight_bytes) -> StepFit:
    best = _search(features, seconds, bandwidth, matmul, _GRID, _GRID, combine, weight_bytes)
    step = _GRID[1] / _GRID[0]
    for _ in range(_REFINE_ROUNDS):  # 9 x 9 points spanning one grid step either side, twice: 0.7% apart
        best = _search(features, seconds, bandwidth, matmul, _around(best.bandwidth_fraction, step),
                       _around(best.matmul_fraction, step), combine, weight_bytes)
        step **= 2 / (_REFINE_POINTS - 1)
    return best


def _around(fraction: float, step: float) -> np.ndarray:
    return np.clip(fraction * step ** np.linspace(-1, 1, _REFINE_POINTS), _GRID[0], _GRID[-1])


def _search(features, seconds, bandwidth, matmul, bandwidth_grid, matmul_grid, combine, weight_bytes) -> StepFit:
    """The (bandwidth, matmul) fraction pair with the least mean |relative error|, overheads solved per pair."""
    seqs = features[0]
    best, best_err = None, np.inf
    for fb in bandwidth_grid:
        for ff in matmul_grid:
            trial = StepFit(float(fb), float(ff), float(ff), 0.0, 0.0)
            body = trial.predict(features, bandwidth, matmul, combine, weight_bytes)
            a, b = _overheads(seconds - body, seqs, seconds)
            err = np.mean(np.abs(body + a + b * seqs - seconds) / seconds)
            if err < best_err:
                best, best_err = dataclasses.replace(trial, step_overhead_s=a, per_seq_overhead_s=b), err
    return best


def _overheads(residual, num_seqs, seconds) -> tuple[float, float]:
    """Non-negative (a, b) minimising sum(((a + b*num_seqs - residual) / seconds)^2)."""
    w = 1.0 / seconds
    a, b = _nnls(np.stack([w, w * num_seqs], axis=1), residual * w)
    return float(a), float(b)


@cache
def _load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def calibrated(hardware: HardwareProfile, path: Path) -> HardwareProfile:
    """`hardware` with fractions and overheads fitted to the step profile at `path` (its combine rule).

    A CPU profile also takes its peaks from the profile's measured ceilings (a CPU has no datasheet
    figure for what one process can reach); a GPU keeps its datasheet peaks. A profile with each step's GPU
    span gives device and host overheads apart (module docstring); `calibration_error` then holds the
    device fit's error against the spans and the error of host + device against the wall time (both over
    every step), and the host fit's (over the steps it kept).
    """
    profile = _load(str(path))
    bandwidth, matmul = hardware.memory_bandwidth, hardware.matmul_flops
    if hardware.kind == "cpu":
        bandwidth = profile["ceilings"]["copy_bytes_per_s"]
        matmul = profile["ceilings"]["matmul_flops_per_s"]
    weight_bytes = StepShape.from_arch(ModelArch.from_dict(profile["model_config"]), profile["dtype"]).weight_bytes
    features, seconds = profile_features(profile)
    spans = gpu_seconds(profile)
    if spans is None:
        fit = fit_steps(features, seconds, bandwidth, matmul, hardware.combine, weight_bytes)
        overheads = {"step_overhead_s": fit.step_overhead_s, "per_seq_overhead_s": fit.per_seq_overhead_s,
                     "device_step_overhead_s": 0.0, "device_per_seq_overhead_s": 0.0}
        error = {"median_rel_error": fit.median_rel_error, "p90_rel_error": fit.p90_rel_error,
                 "num_steps": fit.num_steps, "num_outliers": fit.num_outliers}
        source = f"fitted to {path.name}"
    else:
        fit = fit_steps(features, spans, bandwidth, matmul, hardware.combine, weight_bytes)
        host = fit_host(features[0], np.maximum(seconds - spans, 1e-6))
        overheads = {"step_overhead_s": host.step_overhead_s, "per_seq_overhead_s": host.per_seq_overhead_s,
                     "device_step_overhead_s": fit.step_overhead_s,
                     "device_per_seq_overhead_s": fit.per_seq_overhead_s}
        device = fit.predict(features, bandwidth, matmul, hardware.combine, weight_bytes)
        rel = np.abs((device + host.step_overhead_s + host.per_seq_overhead_s * features[0]) / seconds - 1.0)
        device_rel = np.abs(device / spans - 1.0)  # over every step, the fit's outliers included
        error = {"median_rel_error": float(np.median(rel)), "p90_rel_error": float(np.percentile(rel, 90)),
                 "device_median_rel_error": float(np.median(device_rel)),
                 "device_p90_rel_error": float(np.percentile(device_rel, 90)),
                 "host_median_rel_error": host.median_rel_error, "num_steps": fit.num_steps,
                 "num_outliers": fit.num_outliers, "host_num_outliers": host.num_outliers}
        source = f"fitted to {path.name}: device overheads to each step's GPU span, host overheads to the rest"
    return dataclasses.replace(
        hardware, memory_bandwidth=bandwidth, matmul_flops=matmul, bandwidth_fraction=fit.bandwidth_fraction,
        matmul_fraction=fit.matmul_fraction, attention_fraction=fit.attention_fraction, **overheads,
        fraction_source=f"fitted to {path.name} ({fit.num_steps} steps, {profile['model']}, {profile['dtype']})",
        overhead_source=source, calibration_error=error,
    )


STEP_PROFILES_DIR = Path(__file__).parent / "step_profiles"


def for_model(hardware: HardwareProfile, model: str, key: str | None = None) -> HardwareProfile:
    """`hardware` calibrated on its recorded step profile for `model` (`step_profiles/<key>_<model>.json`,
    e.g. `h200_llama-3.1-8b.json`; `key` is the hardware profile's file stem, by default resolved from its
    name) when there is one; otherwise `hardware` unchanged (datasheet fractions and the profile's stated
    overheads). A profile that already names its calibration is returned as it is."""
    if hardware.calibration:
        return hardware
    path = STEP_PROFILES_DIR / f"{key or hardware_key(hardware.name)}_{model}.json"
    return calibrated(hardware, path) if path.exists() else hardware
