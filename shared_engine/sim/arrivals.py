"""`ArrivalSpec`: when requests (or sessions) start.

Open loop, as `vllm bench serve`: `poisson` (exponential gaps at `rate` per second) or `gamma` (gaps from a
gamma distribution of shape `burstiness` and mean 1/rate; burstiness 1 is Poisson, below 1 burstier);
`rate: inf` sends everything at time 0. Closed loop: `closed_loop` runs `num_users` users that each send
their next request `think_time_s` after their previous one finished (and their first after one think
time, so that users do not all start at once), so load follows the server's speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from shared_engine.config.validation import check_choice, check_range
from shared_engine.sim.distributions import Distribution

PROCESSES = {"poisson", "gamma", "closed_loop"}


@dataclass(frozen=True)
class ArrivalSpec:
    process: str = "poisson"
    rate: float = math.inf  # requests (open loop: sessions) per second
    burstiness: float = 1.0  # gamma shape
    num_users: int = 1  # closed loop
    think_time_s: Distribution = field(default_factory=lambda: Distribution("fixed", {"value": 0.0}, False))

    def __post_init__(self) -> None:
        check_choice("arrival.process", self.process, PROCESSES)
        check_range("arrival.rate", self.rate, 0.0, low_open=True)
        check_range("arrival.burstiness", self.burstiness, 0.0, low_open=True)
        check_range("arrival.num_users", self.num_users, 1)

    @classmethod
    def parse(cls, raw: dict | None) -> ArrivalSpec:
        raw = dict(raw or {})
        if "rate" in raw:
            raw["rate"] = float(raw["rate"])  # accepts "inf"
        if "think_time_s" in raw:
            raw["think_time_s"] = Distribution.parse(raw["think_time_s"], integer=False)
        return cls(**raw)

    @property
    def is_closed_loop(self) -> bool:
        return self.process == "closed_loop"

    def scaled(self, factor: float) -> ArrivalSpec:
        """The same process at `factor` times the traffic (rate, or users for a closed loop)."""
        from dataclasses import replace

        if self.is_closed_loop:
            return replace(self, num_users=max(1, round(self.num_users * factor)))
        return replace(self, rate=self.rate * factor)

    def next_gap(self, rng: np.random.Generator) -> float:
        """Seconds to the next open-loop arrival."""
        if math.isinf(self.rate):
            return 0.0
        if self.process == "gamma":
            return float(rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness)))
        return float(rng.exponential(1.0 / self.rate))
