"""`AutoPolicy`: per step, the draft length for each request that maximises expected tokens per second.

Expected tokens from k drafts when each is accepted with probability a (independently, the run ending at the
first rejection; Leviathan et al. 2023, eq. 1): E(k) = (1 - a^(k+1)) / (1 - a), counting the bonus or
recovered token. A request's a is its running acceptance rate (accepted / drafted, with a prior of 0.5 worth
`_PRIOR_DRAFTS` drafts). The step's cost is the engine's measured step time as a function of the step's shape,
t = c0 + c1 * T + c2 * [the step verifies drafts], fitted by least squares to the last `_WINDOW` steps: T the
tokens in the step (on a GPU decode steps are memory-bound, c1 small against c0; on the CPU they are not), c2
what a speculative step costs beyond its tokens (the proposer, and the host work that async scheduling no
longer hides, since a step with drafts is resolved before the next is scheduled). The choice maximises
sum_r E_r(k_r) / t(T0 + sum_r k_r) (T0: one token per decode), a ratio solved by Dinkelbach's iteration: at
throughput x each request independently takes the k_r that maximises E_r(k_r) - x * c1 * k_r, then x is
recomputed (with c2 once any k_r > 0); the plain step is kept unless that beats it. A draft is worth its cost
only when its chance of being accepted beats the step time it adds per token of throughput, so at large
batches (x large) or low acceptance every k_r is 0 and the step is plain decoding, and speculation comes back
when the batch shrinks or a request's rate recovers. Until the fit has `_MIN_STEPS` steps with at least two
token counts, every request gets k (so the steps it learns from include speculative shapes).
"""

from __future__ import annotations

from collections import deque

import numpy as np

_WINDOW = 256
_MIN_STEPS = 16
_PRIOR_DRAFTS = 4
_PRIOR_RATE = 0.5
_ITERATIONS = 4
_RECHECK_STEPS = 16


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a step yields from k drafts at acceptance `rate` (1 when k == 0)."""
    if rate >= 1.0:
        return k + 1.0
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


def acceptance_rate(request) -> float:
    return ((request.num_accepted_tokens_total + _PRIOR_RATE * _PRIOR_DRAFTS)
            / (request.num_draft_tokens_total + _PRIOR_DRAFTS))


class AutoPolicy:
    def __init__(self, config) -> None:
        self.k = config.num_speculative_tokens
        self._steps: deque[tuple[int, bool, float]] = deque(maxlen=_WINDOW)  # (tokens, speculative, seconds)
        self._fit: tuple[float, float, float] | None = None
        self._dirty = False
        self._last_drafted = True  # the last `num_drafts` gave some request a draft
        self._last_batch = 0
        self._skipped = 0

    def observe_step(self, num_tokens: int, speculative: bool, seconds: float) -> None:
        self._steps.append((num_tokens, speculative, seconds))
        self._dirty = True

    def step_time(self) -> tuple[float, float, float] | None:
        """(c0 seconds, c1 seconds per token, c2 seconds per speculative step), or None before enough
        varied steps."""
        if self._dirty and len(self._steps) >= _MIN_STEPS:
            self._dirty = False
            self._fit = _least_squares(self._steps) or self._fit  # one token count alone fits nothing new
        return self._fit

    def max_drafts(self, num_running: int) -> int:
        """Whether the next step may speculate, before its requests' tokens are resolved (the async stepper
        then resolves the step in flight first): k unless the last decision gave no drafts at a batch at least
        this large, fewer than `_RECHECK_STEPS` steps ago."""
        if self.step_time() is None or self._last_drafted or num_running < self._last_batch:
            return self.k
        self._skipped += 1
        if self._skipped >= _RECHECK_STEPS:
            self._skipped = 0
            return self.k
        return 0

    def num_drafts(self, requests: list, num_running: int) -> list[int]:
        fit = self.step_time()
        if fit is None:
            return [self.k] * len(requests)
        c0, c1, c2 = fit
        tables = [[expected_tokens(acceptance_rate(r), k) for k in range(self.k + 1)] for r in requests]
        best = [0] * len(requests)
        x = num_running / (c0 + c1 * num_running)  # plain decoding's tokens per second
        for _ in range(_ITERATIONS):
            price = x * c1  # tokens of throughput that one more token in the step costs
            ks = [max(range(self.k + 1), key=lambda k, t=t: t[k] - price * k) for t in tables]
            if not any(ks):
                break
            gain = sum(t[k] for t, k in zip(tables, ks)) + (num_running - len(requests))
            x_new = gain / (c0 + c1 * (num_running + sum(ks)) + c2)
            if x_new <= x * (1 + 1e-9):
                break
            best, x = ks, x_new
        self._last_drafted, self._last_batch = any(best), num_running
        return best


def _least_squares(steps) -> tuple[float, float, float] | None:
    """Fit seconds = c0 + c1 * tokens + c2 * speculative (c2 = 0 unless both kinds of step are in the
    window); None when the tokens never vary."""
    data = np.asarray([(t, float(s), sec) for t, s, sec in steps], dtype=np.float64)
    tokens, spec, seconds = data[:, 0], data[:, 1], data[:, 2]
    if np.ptp(tokens) == 0:
        return None
    both = 0 < spec.sum() < len(spec)
    columns = [np.ones_like(tokens), tokens] + ([spec] if both else [])
    coef = np.linalg.lstsq(np.stack(columns, axis=1), seconds, rcond=None)[0]
    c2 = float(coef[2]) if both else 0.0
    return max(1e-6, float(coef[0])), max(0.0, float(coef[1])), max(0.0, c2)
