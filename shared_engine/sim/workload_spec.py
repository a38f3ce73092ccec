"""`WorkloadSpec`: a workload description, read from YAML (see `examples/*.yaml`).

    name: rag-chat
    seed: 0
    num_requests: 10000          # or duration_s: 3600 (no request starts after it)
    arrival: {process: poisson, rate: 20}        # or gamma + burstiness, or closed_loop + num_users
    prompt_len: {dist: uniform, min: 100, max: 300}   # the request's own (unshared) tokens
    output_len: {dist: uniform, min: 100, max: 300}   # generated tokens (ignore_eos: exactly this many)
    prefix:
      system_prompt_len: 4096    # tokens shared by every request that uses the same system prompt
      num_system_prompts: 1
      turns_per_session: 1       # > 1: multi-turn sessions whose prompts grow by every earlier turn
      think_time_s: 5            # between the turns of a session
    adapters: {num_adapters: 30, popularity: zipf, zipf_s: 1.2}   # per-request LoRA adapters
                                 # (+ tenant_per_adapter: true: each adapter is its own tenant, for the
                                 #  engine's --scheduling-policy fair)
    slo: {p99_ttft_ms: 800, p99_tpot_ms: 100}
    prices: {api_input_usd_per_1m: 0.15, api_output_usd_per_1m: 0.60, date: 2026-05, source: "..."}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from shared_engine.config.validation import check_choice, check_range
from shared_engine.sim.arrivals import ArrivalSpec
from shared_engine.sim.distributions import Distribution

SLO_KEYS = {f"{stat}_{metric}_ms" for stat in ("mean", "median", "p90", "p95", "p99")
            for metric in ("ttft", "tpot", "itl", "e2el")}


@dataclass(frozen=True)
class PrefixSpec:
    system_prompt_len: int = 0
    num_system_prompts: int = 1
    turns_per_session: Distribution = field(default_factory=lambda: Distribution("fixed", {"value": 1}))
    think_time_s: Distribution = field(default_factory=lambda: Distribution("fixed", {"value": 0.0}, False))

    def __post_init__(self) -> None:
        check_range("prefix.system_prompt_len", self.system_prompt_len, 0)
        check_range("prefix.num_system_prompts", self.num_system_prompts, 1)


@dataclass(frozen=True)
class AdapterSpec:
    num_adapters: int = 0  # 0: every request runs the base model
    popularity: str = "uniform"  # or "zipf": adapter k (1-based) drawn with weight k**-zipf_s
    zipf_s: float = 1.1
    base_fraction: float = 0.0  # share of requests that use no adapter
    tenant_per_adapter: bool = False  # each adapter's requests are one tenant's (base-model ones: tenant None)

    def __post_init__(self) -> None:
        check_range("adapters.num_adapters", self.num_adapters, 0)
        check_choice("adapters.popularity", self.popularity, {"uniform", "zipf"})
        check_range("adapters.base_fraction", self.base_fraction, 0.0, 1.0)


@dataclass(frozen=True)
class ApiPrices:
    """An API's list price to compare against, as a dated input (US dollars per million tokens)."""

    api_input_usd_per_1m: float | None = None
    api_output_usd_per_1m: float | None = None
    date: str | None = None
    source: str = ""


@dataclass(frozen=True)
class WorkloadSpec:
    name: str = "workload"
    seed: int = 0
    num_requests: int | None = None
    duration_s: float | None = None
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    prompt_len: Distribution = field(default_factory=lambda: Distribution("fixed", {"value": 128}))
    output_len: Distribution = field(default_factory=lambda: Distribution("fixed", {"value": 128}))
    prefix: PrefixSpec = field(default_factory=PrefixSpec)
    adapters: AdapterSpec = field(default_factory=AdapterSpec)
    slo: dict = field(default_factory=dict)
    prices: ApiPrices = field(default_factory=ApiPrices)

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a workload needs num_requests or duration_s")
        check_range("num_requests", self.num_requests, 0, allow_none=True)
        check_range("duration_s", self.duration_s, 0.0, allow_none=True)
        unknown = sorted(set(self.slo) - SLO_KEYS)
        if unknown:
            raise ValueError(f"unknown slo key(s) {unknown}; allowed: {sorted(SLO_KEYS)}")
        if math.isinf(self.arrival.rate) and self.num_requests is None and not self.arrival.is_closed_loop:
            raise ValueError("rate inf needs num_requests")

    @classmethod
    def from_dict(cls, raw: dict) -> WorkloadSpec:
        raw = dict(raw)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown workload key(s) {unknown}; known: {sorted(known)}")
        if "arrival" in raw:
            raw["arrival"] = ArrivalSpec.parse(raw["arrival"])
        for key in ("prompt_len", "output_len"):
            if key in raw:
                raw[key] = Distribution.parse(raw[key])
        if "prefix" in raw:
            prefix = dict(raw["prefix"])
            if "turns_per_session" in prefix:
                prefix["turns_per_session"] = Distribution.parse(prefix["turns_per_session"])
            if "think_time_s" in prefix:
                prefix["think_time_s"] = Distribution.parse(prefix["think_time_s"], integer=False)
            raw["prefix"] = PrefixSpec(**prefix)
        if "adapters" in raw:
            raw["adapters"] = AdapterSpec(**raw["adapters"])
        if "prices" in raw:
            raw["prices"] = ApiPrices(**{k: (str(v) if k == "date" else v) for k, v in raw["prices"].items()})
        return cls(**raw)

    @classmethod
    def from_yaml(cls, path: str | Path) -> WorkloadSpec:
        import yaml

        return cls.from_dict(yaml.safe_load(Path(path).read_text()) or {})

    def scaled(self, factor: float) -> WorkloadSpec:
        """`factor` times the traffic: the arrival rate (or the number of users) scales; the request count
        stays, so a count-bounded run covers 1/factor of the time (a duration-bounded one sees more)."""
        return replace(self, arrival=self.arrival.scaled(factor))
