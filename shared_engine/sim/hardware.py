"""`HardwareProfile`: one accelerator (or this CPU) as the step-time model sees it, loaded from a data file.

Profiles live in `hardware_profiles/<key>.json`, one per device. Peak figures come from the vendor's
datasheet (dense, no sparsity); the achieved fractions come from measurement: on the H200 the measured copy
bandwidth and bf16 matmul rate over its datasheet (4.23/4.8 TB/s, 795/989 TFLOP/s), which the other GPUs
borrow (`achieved_fractions_from`); on a CPU a recorded step profile (`calibration`, fitted by
`calibration.calibrated`). Prices are dated inputs, never constants of the model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from shared_engine.config.validation import check_choice, check_range

PROFILES_DIR = Path(__file__).parent / "hardware_profiles"
COMBINE_RULES = {"phases", "max", "sum"}


@dataclass(frozen=True)
class HardwareProfile:
    """A device. Units: bytes, bytes/s, FLOP/s, seconds, US dollars per hour.

    `memory_bandwidth` and `matmul_flops` are peaks (datasheet, or measured ceilings on a CPU);
    `bandwidth_fraction`, `matmul_fraction` and `attention_fraction` are the achieved shares of those
    peaks. A step's device time is
    `device_step_overhead_s + device_per_seq_overhead_s * num_seqs + combine(memory time, compute time)`
    and its host time (scheduling, input building, launches, output processing)
    `step_overhead_s + per_seq_overhead_s * num_seqs`; a synchronous step costs their sum, one with async
    scheduling the longer of the two (`step_time.py`). Only a step profile that records each step's GPU
    span tells the two apart (`calibration.py`); without one the device overheads stay 0 and the host's
    absorb them. `combine` is `phases` (GPUs: a roofline for the GEMMs plus one for attention, which run one after the
    other), `max` (one roofline over the whole step) or `sum` (no overlap: the CPU); see `step_time.py`.
    """

    name: str
    kind: str  # "gpu" or "cpu"
    memory_bytes: float
    memory_bandwidth: float
    matmul_flops: float
    default_dtype: str
    bandwidth_fraction: float = 1.0
    matmul_fraction: float = 1.0
    attention_fraction: float | None = None  # of the matmul peak; None: as matmul_fraction
    step_overhead_s: float = 0.0
    per_seq_overhead_s: float = 0.0
    device_step_overhead_s: float = 0.0  # device time per step beyond the roofline (sampling, small kernels)
    device_per_seq_overhead_s: float = 0.0
    combine: str = "phases"
    price_usd_per_hour: float | None = None
    price_date: str | None = None
    price_source: str = ""
    datasheet_source: str = ""
    memory_source: str = ""  # where memory_bytes comes from, when not the datasheet
    fraction_source: str = ""
    overhead_source: str = ""
    calibration: str | None = None  # step profile file (relative to the sim package) the fit came from
    calibration_error: dict | None = None  # fit quality on that file (median / p90 relative error)
    # tensor parallelism (sim/tp_comm.py): per collective latency and NCCL bus bandwidth; None: no TP
    allreduce_latency_s: float | None = None
    allreduce_bandwidth: float | None = None  # bytes/s
    allreduce_source: str = ""

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, {"gpu", "cpu"})
        check_choice("combine", self.combine, COMBINE_RULES)
        for name in ("memory_bytes", "memory_bandwidth", "matmul_flops"):
            check_range(name, getattr(self, name), 0, low_open=True)
        # Fractions of measured CPU ceilings may exceed 1 (the copy test is not the best case); a GPU's
        # datasheet peak is a hard bound.
        limit = 1.0 if self.kind == "gpu" else 10.0
        for name in ("bandwidth_fraction", "matmul_fraction", "attention_fraction"):
            check_range(name, getattr(self, name), 0.0, limit, low_open=True, allow_none=True)
        check_range("step_overhead_s", self.step_overhead_s, 0.0)
        check_range("per_seq_overhead_s", self.per_seq_overhead_s, 0.0)
        check_range("device_step_overhead_s", self.device_step_overhead_s, 0.0)
        check_range("device_per_seq_overhead_s", self.device_per_seq_overhead_s, 0.0)
        check_range("price_usd_per_hour", self.price_usd_per_hour, 0.0, allow_none=True)
        check_range("allreduce_latency_s", self.allreduce_latency_s, 0.0, allow_none=True)
        check_range("allreduce_bandwidth", self.allreduce_bandwidth, 0.0, low_open=True, allow_none=True)

    @property
    def achieved_bandwidth(self) -> float:
        return self.memory_bandwidth * self.bandwidth_fraction

    @property
    def achieved_matmul_flops(self) -> float:
        return self.matmul_flops * self.matmul_fraction

    @property
    def achieved_attention_flops(self) -> float:
        return self.matmul_flops * (self.attention_fraction or self.matmul_fraction)

    def with_price(self, usd_per_hour: float, date: str = "user input") -> HardwareProfile:
        return dataclasses.replace(self, price_usd_per_hour=usd_per_hour, price_date=date,
                                   price_source="given on the command line")


def hardware_names() -> list[str]:
    """Keys accepted by `load_hardware` (file stems: `h200`, `h100-sxm`, ..., `cpu-2core`)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def _normalise(name: str) -> str:
    return name.strip().lower().replace(" ", "-").replace("_", "-")


@cache
def load_hardware(name: str) -> HardwareProfile:
    """Load a profile by key or display name (`H200`, `h100-sxm`, `cpu-2core`, case-insensitive).

    Raises:
        ValueError: no such profile (the message lists the known ones).
    """
    raw = _read(name)
    fields = {f.name for f in dataclasses.fields(HardwareProfile)}
    if "measured_bandwidth" in raw:  # the reference device: fractions are measured / datasheet
        raw["bandwidth_fraction"] = raw["measured_bandwidth"] / raw["memory_bandwidth"]
        raw["matmul_fraction"] = raw["measured_matmul_flops"] / raw["matmul_flops"]
        raw.setdefault("fraction_source", raw.get("measured_source", ""))
    if "achieved_fractions_from" in raw:
        ref = load_hardware(raw["achieved_fractions_from"])
        raw["bandwidth_fraction"], raw["matmul_fraction"] = ref.bandwidth_fraction, ref.matmul_fraction
    profile = HardwareProfile(**{k: v for k, v in raw.items() if k in fields})
    if profile.calibration:
        from shared_engine.sim.calibration import calibrated

        profile = calibrated(profile, Path(__file__).parent / profile.calibration)
    return profile


def hardware_key(name: str) -> str:
    """The profile's file stem for a key or display name (`A100 80GB SXM` -> `a100-80gb`), which also names
    its step profiles (`step_profiles/<key>_<model>.json`).

    Raises:
        ValueError: no such profile (the message lists the known ones).
    """
    key = _normalise(name)
    if (PROFILES_DIR / f"{key}.json").exists():
        return key
    for candidate in PROFILES_DIR.glob("*.json"):
        if _normalise(json.loads(candidate.read_text())["name"]) == key:
            return candidate.stem
    raise ValueError(f"unknown hardware {name!r}; known: {', '.join(hardware_names())}")


def _read(name: str) -> dict:
    return json.loads((PROFILES_DIR / f"{hardware_key(name)}.json").read_text())
