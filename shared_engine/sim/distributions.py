"""Length and time distributions for workloads, behind a small registry.

A spec is a number (fixed) or a mapping with `dist` and its parameters, as in a workload YAML:

    prompt_len: {dist: uniform, min: 100, max: 1024}     # nano-vllm's offline workload
    output_len: {dist: random, mean: 256, range_ratio: 0.5}   # `vllm bench serve --dataset-name random`
    think_time_s: {dist: exponential, mean: 5}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

_SAMPLERS: dict[str, Callable] = {}
_REQUIRED: dict[str, tuple[str, ...]] = {}


def register(name: str, *required: str):
    def wrap(fn):
        _SAMPLERS[name] = fn
        _REQUIRED[name] = required
        return fn

    return wrap


@register("fixed", "value")
def _fixed(rng, p, size):
    return np.full(size, float(p["value"]))


@register("uniform", "min", "max")
def _uniform(rng, p, size):  # integers: both ends included
    return rng.integers(int(p["min"]), int(p["max"]) + 1, size=size).astype(float)


@register("random", "mean")
def _random(rng, p, size):  # vLLM's random dataset: uniform in [mean*(1-r), mean*(1+r)]
    r = float(p.get("range_ratio", 0.0))
    lo, hi = int(p["mean"] * (1 - r)), int(p["mean"] * (1 + r))
    return rng.integers(lo, hi + 1, size=size).astype(float)


@register("normal", "mean", "std")
def _normal(rng, p, size):
    return rng.normal(p["mean"], p["std"], size=size)


@register("lognormal", "mean", "sigma")
def _lognormal(rng, p, size):  # `mean` is the distribution's mean, not mu
    sigma = float(p["sigma"])
    return rng.lognormal(np.log(p["mean"]) - sigma**2 / 2, sigma, size=size)


@register("exponential", "mean")
def _exponential(rng, p, size):
    return rng.exponential(p["mean"], size=size)


@register("choice", "values")
def _choice(rng, p, size):  # an empirical list, optionally weighted
    weights = p.get("weights")
    probs = None if weights is None else np.asarray(weights, float) / np.sum(weights)
    return rng.choice(np.asarray(p["values"], float), size=size, p=probs)


@dataclass(frozen=True)
class Distribution:
    """A validated distribution spec. `sample(rng, size)` returns floats clipped to [`min`, `max`] when the
    spec gives bounds (for `normal`, `lognormal`, `exponential`); `integer=True` rounds to >= 1."""

    dist: str
    params: dict = field(default_factory=dict)
    integer: bool = True

    def __post_init__(self) -> None:
        if self.dist not in _SAMPLERS:
            raise ValueError(f"dist must be one of {sorted(_SAMPLERS)}, got {self.dist!r}")
        missing = [k for k in _REQUIRED[self.dist] if k not in self.params]
        if missing:
            raise ValueError(f"dist {self.dist!r} needs {missing} (got {sorted(self.params)})")

    @classmethod
    def parse(cls, spec, integer: bool = True) -> Distribution:
        if isinstance(spec, Distribution):
            return spec
        if isinstance(spec, int | float):
            return cls("fixed", {"value": spec}, integer)
        if not isinstance(spec, dict) or "dist" not in spec:
            raise ValueError(f"a distribution is a number or a mapping with 'dist', got {spec!r}")
        params = {k: v for k, v in spec.items() if k != "dist"}
        return cls(spec["dist"], params, integer)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        values = _SAMPLERS[self.dist](rng, self.params, size)
        low = self.params.get("min", 1 if self.integer else 0.0)
        values = np.clip(values, low, self.params.get("max", np.inf))
        return np.maximum(1, np.rint(values)).astype(np.int64) if self.integer else values

    def sample_one(self, rng: np.random.Generator) -> int | float:
        """`sample(rng, 1)[0]` as a Python number: the same draw from `rng`, the same clipping and rounding
        (half to even), without the per-call array overhead (workloads draw a few per request)."""
        value = float(_SAMPLERS[self.dist](rng, self.params, 1)[0])
        value = min(max(value, self.params.get("min", 1 if self.integer else 0.0)), self.params.get("max", math.inf))
        return max(1, round(value)) if self.integer else float(value)

    @property
    def mean(self) -> float:
        """The mean before clipping, for reports (uniform and random: the midpoint)."""
        p = self.params
        if self.dist == "fixed":
            return float(p["value"])
        if self.dist == "uniform":
            return (p["min"] + p["max"]) / 2
        if self.dist == "choice":
            return float(np.average(p["values"], weights=p.get("weights")))
        return float(p["mean"])
