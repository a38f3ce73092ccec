"""`AutoPolicy`: per step, the draft length for each request that maximises expected tokens per second.

Expected tokens from k drafts when each is accepted with probability a (independently, the run ending at the
first rejection; Leviathan et al. 2023, eq. 1): E(k) = (1 - a^(k+1)) / (1 - a), counting the bonus or
recovered token. A request's a is its running acceptance rate (accepted / drafted, with a prior of 0.5 worth
`_PRIOR_DRAFTS` drafts). The step's cost is the engine's measured step time as a function of the tokens in
the step, t(T) = c0 + c1 * T, fitted by least squares to the last `_WINDOW` steps (batch shapes the runner
actually ran; on a GPU decode steps are memory-bound, c1 small against c0, on the CPU they are not). The
choice maximises sum_r E_r(k_r) / t(T0 + sum_r k_r) (T0: one token per decode), a ratio solved by
Dinkelbach's iteration: at throughput x each request independently takes the k_r that maximises
E_r(k_r) - x * c1 * k_r, then x is recomputed. A draft is worth its cost only when its chance of being
accepted beats the step time it adds per token of throughput, so at large batches (x large) or low
acceptance every k_r is 0 and the step is plain decoding, and speculation comes back when the batch shrinks
or a request's rate recovers. Until the fit has `_MIN_STEPS` steps with at least two token counts, every
request gets k (so the steps it learns from include speculative shapes).
"""

from __future__ import annotations

from collections import deque

_WINDOW = 256
_MIN_STEPS = 16
_PRIOR_DRAFTS = 4
_PRIOR_RATE = 0.5
_ITERATIONS = 4


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
        self._steps: deque[tuple[int, float]] = deque(maxlen=_WINDOW)  # (tokens, seconds)
        self._fit: tuple[float, float] | None = None
        self._dirty = False

    def observe_step(self, num_seqs: int, num_tokens: int, seconds: float) -> None:
        self._steps.append((num_tokens, seconds))
        self._dirty = True

    def step_time(self) -> tuple[float, float] | None:
        """(c0 seconds, c1 seconds per token) of t(T) = c0 + c1 T, or None before enough varied steps."""
        if self._dirty and len(self._steps) >= _MIN_STEPS:
            self._dirty = False
            self._fit = _least_squares(self._steps) or self._fit  # one token count alone fits nothing new
        return self._fit

    def max_drafts(self, num_running: int) -> int:
        fit = self.step_time()
        if fit is None:
            return self.k
        c0, c1 = fit
        # the most any request could get: a request certain to be accepted at this batch's plain throughput
        x = num_running / (c0 + c1 * num_running)
        return self.k if x * c1 < 1.0 else 0

    def num_drafts(self, requests: list, num_running: int) -> list[int]:
        fit = self.step_time()
        if fit is None:
            return [self.k] * len(requests)
        c0, c1 = fit
        rates = [acceptance_rate(r) for r in requests]
        tables = [[expected_tokens(a, k) for k in range(self.k + 1)] for a in rates]
        best = [0] * len(requests)
        x = num_running / (c0 + c1 * num_running)  # plain decoding's tokens per second
        for _ in range(_ITERATIONS):
            price = x * c1  # tokens of throughput that one more token in the step costs
            ks = [max(range(self.k + 1), key=lambda k, t=t: t[k] - price * k) for t in tables]
            gain = sum(t[k] for t, k in zip(tables, ks)) + (num_running - len(requests))
            x_new = gain / (c0 + c1 * (num_running + sum(ks)))
            if x_new <= x * (1 + 1e-9):
                break
            best, x = ks, x_new
        return best


def _least_squares(steps) -> tuple[float, float] | None:
    n = len(steps)
    mean_t = sum(t for t, _ in steps) / n
    mean_s = sum(s for _, s in steps) / n
    var = sum((t - mean_t) ** 2 for t, _ in steps)
    if var == 0:
        return None
    c1 = max(0.0, sum((t - mean_t) * (s - mean_s) for t, s in steps) / var)
    c0 = max(1e-6, mean_s - c1 * mean_t)
    return c0, c1
