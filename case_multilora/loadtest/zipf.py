"""True Zipf popularity over tenants (no locust import, so tests and the cost model can use it)."""

from __future__ import annotations

import random


def zipf_weights(n: int, s: float = 1.1) -> list[float]:
    """P(k-th most popular of n) proportional to k^-s (k = 1..n), normalised. s = 1.1 is the brief's; S-LoRA's
    `power(alpha=1)` workload is uniform over adapters, not this."""
    weights = [(k + 1) ** -s for k in range(n)]
    total = sum(weights)
    return [w / total for w in weights]


def zipf_choice(rng: random.Random, n: int, s: float) -> int:
    """An index in [0, n) drawn with `zipf_weights(n, s)`."""
    return rng.choices(range(n), weights=zipf_weights(n, s))[0]
