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
when the batch shrinks or a request's rate recovers.

What exploring costs is bounded (issue 17; measured on the H200 at c518670, llama-3.1-8b dummy, 1000-token
prompts, forced acceptance 0.8, benchmarks/results/spec_decode_h200_replay_c518670.json): a speculative step
there cost 2.7x a plain one at batch 64, 4.6x at 256 and 4.0x at 448 (k = 3), so the 16 steps every request
used to speculate on before the fit existed (14-15% of a 128-token run's steps) lost 6-25% of throughput on
their own, and their uneven progress left a tail of small steps. Now a step drafting while c2 is unknown (no
fit yet, or none of the window's steps drafted) is a probe, allowed only while the probes' steps so far take at
most `_PROBE_SHARE` (1%) of all observed step time, the first free: one probe before the fit (all requests at
k; it gives the fit its speculative shape, so c2), plain steps after it until the fit exists, and once the
window has lost its last speculative step, the next probe when the budget allows (one step per 256 at batch
448 would have cost 1.2-1.6% there). After a decision with no drafts, `max_drafts` asks whether any k could pay
at this batch with the requests at the rates the last decision saw (rates change only by speculating; a new
request has the prior), from the fit alone: a step it declines is not resolved early, so async scheduling
overlaps it as with speculation unconfigured (no periodic re-check, no early resolve when the batch merely
shrinks).
"""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

_WINDOW = 256
_MIN_STEPS = 8
_PRIOR_DRAFTS = 4
_PRIOR_RATE = 0.5
_ITERATIONS = 4
_PROBE_SHARE = 0.01  # of observed step time, the most that probes (steps drafting with c2 unknown) may take


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
        self._num_speculative = 0  # steps with drafts in `_steps`
        self._fit: tuple[float, float, float] | None = None
        self._dirty = False
        self._last_drafted = True  # the last `num_drafts` gave some request a draft
        self._last_rates: list[tuple[float, int]] = []  # the last `num_drafts`'s rates, highest first, counted
        self._seconds = 0.0  # every observed step's
        self._probe_seconds = 0.0  # the probe steps' (all of each: what they cost is at most that)
        self._probe_pending = 0  # observations left in which a probe's step can still arrive

    def observe_step(self, num_tokens: int, speculative: bool, seconds: float) -> None:
        if len(self._steps) == self._steps.maxlen:
            self._num_speculative -= self._steps[0][1]
        self._steps.append((num_tokens, speculative, seconds))
        self._num_speculative += speculative
        self._dirty = True
        self._seconds += seconds
        if self._probe_pending:  # a probe's step arrives within two observations (one step late when async)
            self._probe_pending = 0 if speculative else self._probe_pending - 1
            self._probe_seconds += seconds if speculative else 0.0

    def step_time(self) -> tuple[float, float, float] | None:
        """(c0 seconds, c1 seconds per token, c2 seconds per speculative step), or None before enough
        varied steps."""
        if self._dirty and len(self._steps) >= _MIN_STEPS:
            self._dirty = False
            self._fit = _least_squares(self._steps) or self._fit  # one token count alone fits nothing new
        return self._fit

    def _probing(self, fit) -> bool:
        """Whether a step with drafts now would be a probe: no fit yet, or none of the window's steps drafted
        (so c2 is unknown)."""
        return fit is None or self._num_speculative == 0

    def _may_probe(self) -> bool:
        """A probe only while the probes' steps so far cost at most `_PROBE_SHARE` of all observed step time
        (the first is free), and none is in flight."""
        return not self._probe_pending and self._probe_seconds <= _PROBE_SHARE * self._seconds

    def max_drafts(self, num_running: int) -> int:
        """Whether the next step may speculate, before its requests' tokens are resolved (the async stepper
        resolves the step in flight first only when this is > 0): 0 while c2 is unknown and the probe budget
        spent; k for the first probe; after a decision with drafts, k; else k only if `num_running` requests
        at the highest of the rates the last decision saw (the prior's for any beyond them) would speculate:
        rates change only by speculating, so this bounds what `num_drafts` can choose, in
        O(distinct rates * k)."""
        fit = self.step_time()
        if self._probing(fit):
            if not self._may_probe():
                return 0
            if fit is None:
                return self.k
        elif self._last_drafted:
            return self.k
        groups, left = [], num_running
        for rate, count in self._last_rates:
            if left <= 0:
                break
            groups.append((rate, min(count, left)))
            left -= groups[-1][1]
        if left > 0:
            groups.append((_PRIOR_RATE, left))
        tables = [[expected_tokens(rate, k) for k in range(self.k + 1)] for rate, _ in groups]
        return self.k if any(_choose(fit, tables, [n for _, n in groups], num_running)) else 0

    def num_drafts(self, requests: list, num_running: int) -> list[int]:
        fit = self.step_time()
        rates = [acceptance_rate(r) for r in requests]
        probing = self._probing(fit)
        if probing and not self._may_probe():
            best = [0] * len(requests)
        elif fit is None:  # the first probe: its step gives the fit a speculative shape (c2)
            best = [self.k] * len(requests)
        else:  # with c2 unknown (0 in the fit) this drafts wherever the tokens alone pay: a probe
            tables = [[expected_tokens(a, k) for k in range(self.k + 1)] for a in rates]
            best = _choose(fit, tables, [1] * len(requests), num_running)
        if probing and any(best):
            self._probe_pending = 2
        self._last_drafted = any(best)
        self._last_rates = sorted(Counter(rates).items(), reverse=True)
        return best


def _choose(fit: tuple[float, float, float], tables: list[list[float]], counts: list[int],
            num_running: int) -> list[int]:
    """Dinkelbach's iteration (module docstring): the draft length per group of requests (`counts[i]` requests
    with expected-token table `tables[i]`, E(0) .. E(k)) that maximises the step's tokens per second, all 0
    where the plain step is best. `num_running` counts every decode in the step (those not in a group get 1
    token)."""
    c0, c1, c2 = fit
    k_max = len(tables[0]) - 1 if tables else 0
    best = [0] * len(tables)
    x = num_running / (c0 + c1 * num_running)  # plain decoding's tokens per second
    for _ in range(_ITERATIONS):
        price = x * c1  # tokens of throughput that one more token in the step costs
        ks = [max(range(k_max + 1), key=lambda k, t=t: t[k] - price * k) for t in tables]
        if not any(ks):
            break
        gain = sum(n * t[k] for t, k, n in zip(tables, ks, counts)) + (num_running - sum(counts))
        x_new = gain / (c0 + c1 * (num_running + sum(n * k for k, n in zip(ks, counts))) + c2)
        if x_new <= x * (1 + 1e-9):
            break
        best, x = ks, x_new
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
