"""`AutoPolicy`: per step, the draft length for each request that maximises expected tokens per second.

Expected tokens from k drafts when each is accepted with probability a (independently, the run ending at the
first rejection; Leviathan et al. 2023, eq. 1): E(k) = (1 - a^(k+1)) / (1 - a), counting the bonus or
recovered token. A request's a is its running acceptance rate (accepted / drafted, with a prior of 0.5 worth
`_PRIOR_DRAFTS` drafts). The step's cost is the engine's measured step time as a function of the step's shape,
t = c0 + c1 * T + c2 * [the step verifies drafts] + c3 * D, fitted by least squares to the last `_WINDOW`
steps: T the step's tokens other than drafts (on a GPU decode steps are memory-bound, c1 small against c0; on
the CPU they are not), D its draft tokens, c3 what one draft token costs to verify (its token included), c2
what a speculative step costs beyond its drafts (the proposer, and the host work that async scheduling no
longer hides, since a step with drafts is resolved before the next is scheduled). c2 and c3 are told apart
only when the window's speculative steps drafted at least two different D; until then the whole extra cost is
put on c3 (per draft token), which overprices small drafts rather than underpricing large ones. The choice
maximises sum_r E_r(k_r) / t (T0: one token per decode), a ratio solved by Dinkelbach's iteration: at
throughput x each request independently takes the k_r that maximises E_r(k_r) - x * c3 * k_r, then x is
recomputed (with c2 once any k_r > 0); the plain step is kept unless that beats it. A draft is worth its cost
only when its chance of being accepted beats the step time it adds per token of throughput, so at large
batches (x large) or low acceptance every k_r is 0 and the step is plain decoding, and speculation comes back
when the batch shrinks or a request's rate recovers.

Padded steps: on CUDA a step of decodes whose tokens fit the largest decode graph (`padding[2]` rows) runs each
speculative decode as k + 1 decode rows (input_builder.decode_rows), linear in draft tokens. A wider one that
drafts for at most `padding[0]` requests (the graph runner's MAX_PREFILL_SEQS, 8) rides a mixed graph, also about
linear; one that drafts for more replays a varlen graph that runs every sequence of the step, plain decodes too,
at `padding[1] + 1` query tokens (cuda_graph_runner.py), so its cost is that of padding[1] draft tokens for every
sequence, whatever the requests drafted. `observe_step` counts such a step's draft tokens that way (given the
number of drafting requests), and `_choose` compares the best linear step (drafting for at most padding[0]
requests, or for as many as fit the decode rows) with the best padded one (every drafting request at its most
drafts, all sequences paid). Measured on the H200 at 0f88fd9 (spec_decode_h200_replay1000_0f88fd9.json, batch
448, k 5): 21 steps that drafted for more than 8 requests, each ~3.6x a plain step, took most of the 0.931x; the
linear fit had priced them from 8-request steps. `padding` is None (no padding) on the CPU and without CUDA
graphs.

What a step costs is what the engine reports (engine/async_output.py): its device span plus the host time
during which the device sat idle before it because the step in flight had to be resolved first, that bubble
charged to the speculative step that caused it (the one whose drafts had to be resolved, or the one that
resolved its predecessor in order to draft), so c2 holds the host work that a speculative step puts on the
critical path. At 0f88fd9 the device span alone was the cost, and at b274e59 a probe of 8 requests looked
cheaper than a plain step (33.7 against 36.8 ms of device span at batch 448) while it took 51 ms of wall time.

What exploring costs is bounded (issue 17; measured on the H200 at 9a99c62, llama-3.1-8b dummy, 1000-token
prompts, forced acceptance 0.8, benchmarks/results/spec_decode_h200_replay_9a99c62.json): a step with every
request at k = 3 cost 2.6x a plain one at batch 64, 4.2x at 256 and 3.9x at 448 (k = 5: 2.5x / 3.9x / 3.6x),
its extra cost growing with the drafting requests (about 0.2 ms each at 256 and 448) where a fixed c2 priced it
as at batch 1 (1.3 ms). At 9a99c62 the probe (a step drafting while c2 is unknown) gave every request k, and
throughput with the policy on was 0.94-1.01x of speculation off (4 of 6 below 0.98x). Now:
- a probe drafts for at most `_PROBE_REQUESTS` (8) requests, those with the highest rates, allowed only while
  the probes' steps so far take at most `_PROBE_SHARE` (1%) of all observed step time (the first free; the next
  once the window has lost its last speculative step). 8 is the CUDA graph runner's MAX_PREFILL_SEQS: such a
  step replays a mixed graph (the drafting requests as short prefill chunks beside the plain decodes, about
  1.1x a plain step at batch 448 in the simulation's calibration, not measured alone), where more drafting
  requests make it a varlen graph that runs every sequence through the prefill kernel (the 3.9x above);
- after a probe or a decision, the requests that draft may at most double per step (at least
  `_PROBE_REQUESTS`), so a mis-fit never makes the whole batch speculative at once, and each wider step gives
  the fit another D (so c2 and c3 apart);
- the per-draft-token term c3 prices a large batch's drafts at what they cost.
With step costs shaped like 9a99c62's, a 1000-token run at batch 64 / 256 / 448 then simulates at >= 0.98x of
speculation off (tests/engine/test_spec_policy_h200_costs.py). After a decision with no drafts, `max_drafts`
asks whether any k could pay at this batch with the requests at the rates the last decision saw (rates change
only by speculating; a new request has the prior), from the fit alone: a step it declines is not resolved
early, so async scheduling overlaps it as with speculation unconfigured (no periodic re-check, no early resolve
when the batch merely shrinks).
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
_SPIKE_FACTOR = 3.0  # a step this many times what the other steps predict for it is left out of the fit (`_spikes`)
_FREE_PROBES = 1  # probes not counted against `_PROBE_SHARE` (besides those `_may_probe` finds were spikes)
_PROBE_REQUESTS = 8  # the most requests a probe drafts for, and the least that widening allows (= MAX_PREFILL_SEQS)


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a step yields from k drafts at acceptance `rate` (1 when k == 0)."""
    if rate >= 1.0:
        return k + 1.0
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


def acceptance_rate(request) -> float:
    return ((request.num_accepted_tokens_total + _PRIOR_RATE * _PRIOR_DRAFTS)
            / (request.num_draft_tokens_total + _PRIOR_DRAFTS))


Fit = tuple[float, float, float, float]  # (c0 s, c1 s per non-draft token, c2 s per speculative step, c3 s/draft)


class AutoPolicy:
    def __init__(self, config) -> None:
        self.k = config.num_speculative_tokens
        self._steps: deque[tuple[int, int, float]] = deque(maxlen=_WINDOW)  # (tokens, draft tokens, seconds)
        self._fit: Fit | None = None
        self._fit_speculative = 0  # speculative steps the fit kept (`_least_squares`: not spikes)
        self._dirty = False
        self._last_drafted = True  # the last `num_drafts` gave some request a draft
        self._width = 0  # requests the last `num_drafts` gave drafts to (the next may give at most twice as many)
        self._last_rates: list[tuple[float, int]] = []  # the last `num_drafts`'s rates, highest first, counted
        self._seconds = 0.0  # every observed step's
        self._probe_seconds = 0.0  # the probe steps' (all of each: what they cost is at most that)
        self._num_probes = 0  # probes chosen so far
        self._probe_steps: deque[tuple[int, float]] = deque(maxlen=16)  # the last probes' (non-draft tokens, s)
        self._probe_pending = 0  # observations left in which a probe's step can still arrive
        # (most drafting requests in a mixed graph, padded drafts per sequence, most decode rows); module docstring
        self.padding: tuple[int, int, int] | None = None

    def observe_step(self, num_tokens: int, speculative: bool, seconds: float,
                     num_draft_tokens: int | None = None, num_drafting: int = 0) -> None:
        """A step's `num_tokens` (drafts included), whether it verified drafts, its seconds, its draft tokens
        (None: unknown, taken as 1 per speculative step, so c3 then acts as a per-step cost) and the requests
        that drafted (beyond `padding[0]` the step is counted as `padding[1]` drafts for each of its sequences)."""
        drafts = (1 if speculative else 0) if num_draft_tokens is None else num_draft_tokens
        speculative = drafts > 0
        if self.padding is not None and num_drafting > self.padding[0] and num_tokens > self.padding[2]:
            sequences = num_tokens - drafts  # one verified or plain-decode token per sequence
            drafts = sequences * self.padding[1]
            num_tokens = sequences + drafts
        self._steps.append((num_tokens, drafts, seconds))
        self._dirty = True
        self._seconds += seconds
        if self._probe_pending:  # a probe's step arrives within two observations (one step late when async)
            self._probe_pending = 0 if speculative else self._probe_pending - 1
            self._probe_seconds += seconds if speculative else 0.0
            if speculative:
                self._probe_steps.append((num_tokens - drafts, seconds))

    def step_time(self) -> Fit | None:
        """(c0 seconds, c1 seconds per non-draft token, c2 seconds per speculative step, c3 seconds per draft
        token), or None before enough varied steps; c2 = c3 = 0 while no step in the window drafted."""
        if self._dirty and len(self._steps) >= _MIN_STEPS:
            self._dirty = False
            fitted = _least_squares(self._steps, self._fit)
            if fitted is not None:
                self._fit, self._fit_speculative = fitted
        return self._fit

    def _probing(self, fit) -> bool:
        """Whether a step with drafts now would be a probe: no fit yet, or none of the steps it kept drafted
        (none of the window's did, or those that did were spikes), so c2 and c3 are unknown."""
        return fit is None or self._fit_speculative == 0

    def _may_probe(self, fit: Fit | None) -> bool:
        """A probe only while none is in flight and the probes' steps so far cost at most `_PROBE_SHARE` of all
        observed step time, the first `_FREE_PROBES` free. A probe whose step took more than `_SPIKE_FACTOR` times
        the fit's plain step of its tokens was a spike (`_spikes`; one of the last 16 probes): it is neither
        charged nor counted, so one slow first probe (at batch 1 the only one the budget allows for seconds)
        does not keep speculation off."""
        if self._probe_pending:
            return False
        spiked = [] if fit is None else [s for t, s in self._probe_steps if s > _SPIKE_FACTOR * (fit[0] + fit[1] * t)]
        return (self._num_probes < _FREE_PROBES + len(spiked)
                or self._probe_seconds - sum(spiked) <= _PROBE_SHARE * self._seconds)

    def _cap(self, probing: bool) -> int:
        """The most requests the next step may give drafts to: `_PROBE_REQUESTS` for a probe, else twice the
        last decision's (at least `_PROBE_REQUESTS`)."""
        return _PROBE_REQUESTS if probing else max(_PROBE_REQUESTS, 2 * self._width)

    def max_drafts(self, num_running: int) -> int:
        """Whether the next step may speculate, before its requests' tokens are resolved (the async stepper
        resolves the step in flight first only when this is > 0): 0 while c2 is unknown and the probe budget
        spent; k for a probe; after a decision with drafts, k; else k only if `num_running` requests
        at the highest of the rates the last decision saw (the prior's for any beyond them) would speculate:
        rates change only by speculating, so this bounds what `num_drafts` can choose, in
        O(distinct rates * k)."""
        fit = self.step_time()
        if self._probing(fit):
            return self.k if self._may_probe(fit) else 0
        if self._last_drafted:
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
        ks, _ = _choose(fit, tables, [n for _, n in groups], num_running, self._cap(False), self.padding)
        return self.k if any(ks) else 0

    def num_drafts(self, requests: list, num_running: int) -> list[int]:
        fit = self.step_time()
        rates = [acceptance_rate(r) for r in requests]
        probing = self._probing(fit)
        if probing and not self._may_probe(fit):
            best = [0] * len(requests)
        elif probing:  # a probe: k for the `_PROBE_REQUESTS` likeliest to accept (c2 and c3 from its step)
            top = sorted(range(len(requests)), key=lambda i: -rates[i])[:_PROBE_REQUESTS]
            best = [0] * len(requests)
            for i in top:
                best[i] = self.k
        else:
            tables = [[expected_tokens(a, k) for k in range(self.k + 1)] for a in rates]
            ks, drafting = _choose(fit, tables, [1] * len(requests), num_running, self._cap(False), self.padding)
            best = [k if n else 0 for k, n in zip(ks, drafting)]
        if probing and any(best):
            self._probe_pending = 2
            self._num_probes += 1
        self._last_drafted = any(best)
        self._width = sum(1 for k in best if k)
        self._last_rates = sorted(Counter(rates).items(), reverse=True)
        return best


def _choose(fit: Fit, tables: list[list[float]], counts: list[int], num_running: int, cap: int,
            padding: tuple[int, int] | None = None) -> tuple[list[int], list[int]]:
    """The draft length per group of requests (`counts[i]` requests with expected-token table `tables[i]`,
    E(0) .. E(k)) and how many of the group draft it (at most `cap` requests in all), maximising the step's
    tokens per second; all 0 where the plain step is best. `num_running` counts every decode in the step (those
    not in a group get 1 token). With `padding` (module docstring), the better of the best linear step and the
    best padded one."""
    if padding is None:
        return _dinkelbach(fit, tables, counts, num_running, cap)[:2]
    limit, per_sequence, rows = padding
    linear = min(cap, max(limit, (rows - num_running) // max(per_sequence, 1)))  # as decode rows or a mixed graph
    narrow = _dinkelbach(fit, tables, counts, num_running, linear)
    if cap <= linear or sum(counts) <= linear:  # no step drafts for more requests than that: never padded
        return narrow[:2]
    wide = _padded(fit, tables, counts, num_running, cap, num_running * per_sequence)
    return (wide if wide[2] > narrow[2] else narrow)[:2]


def _padded(fit: Fit, tables: list[list[float]], counts: list[int], num_running: int, cap: int,
            drafts: int) -> tuple[list[int], list[int], float]:
    """The padded step (every sequence paid as `drafts` draft tokens in all): the `cap` requests that gain most
    draft their most; (ks, drafting per group, tokens per second)."""
    c0, c1, c2, c3 = fit
    ks = [len(t) - 1 for t in tables]
    left, ns = cap, [0] * len(tables)
    for i in sorted(range(len(tables)), key=lambda i: -(tables[i][-1] - tables[i][0])):
        ns[i] = min(counts[i], left)
        left -= ns[i]
    gain = sum(n * (t[-1] - t[0]) for t, n in zip(tables, ns)) + sum(
        n * t[0] for t, n in zip(tables, counts)) + (num_running - sum(counts))
    return ks, ns, gain / (c0 + c1 * num_running + c2 + c3 * drafts)


def _dinkelbach(fit: Fit, tables: list[list[float]], counts: list[int], num_running: int,
                cap: int) -> tuple[list[int], list[int], float]:
    """Dinkelbach's iteration (module docstring) over steps whose cost is linear in draft tokens:
    (ks, drafting per group, tokens per second), plain decoding's rate when nothing beats it."""
    c0, c1, c2, c3 = fit
    k_max = len(tables[0]) - 1 if tables else 0
    best, best_n = [0] * len(tables), [0] * len(tables)
    x = num_running / (c0 + c1 * num_running)  # plain decoding's tokens per second
    for _ in range(_ITERATIONS):
        price = x * c3  # tokens of throughput that one more draft token in the step costs
        ks = [max(range(k_max + 1), key=lambda k, t=t: t[k] - price * k) for t in tables]
        if not any(ks):
            break
        left, ns = cap, [0] * len(tables)
        for i in sorted(range(len(tables)), key=lambda i: -(tables[i][ks[i]] - tables[i][0] - price * ks[i])):
            if ks[i]:
                ns[i] = min(counts[i], left)
                left -= ns[i]
        gain = sum(n * (t[k] - t[0]) for t, k, n in zip(tables, ks, ns)) + sum(
            n * t[0] for t, n in zip(tables, counts)) + (num_running - sum(counts))
        drafts = sum(n * k for k, n in zip(ks, ns))
        x_new = gain / (c0 + c1 * num_running + c3 * drafts + c2)
        if x_new <= x * (1 + 1e-9):
            break
        best, best_n, x = ks, ns, x_new
    return best, best_n, x


def _least_squares(steps, previous: Fit | None, drop_spikes: bool = True) -> tuple[Fit, int] | None:
    """Fit seconds = c0 + c1 * (tokens - drafts) + c2 * [drafts > 0] + c3 * drafts (module docstring): c2 and c3
    0 unless the window has both plain and speculative steps, c2 0 unless its speculative steps drafted at least
    two different counts; c1 the previous fit's (else 0) when the non-draft tokens never vary.
    None when there is neither a previous fit nor varied non-draft tokens, else (the fit, the speculative steps
    it kept). With `drop_spikes`, the steps that `_spikes` flags are left out and the rest refitted."""
    data = np.asarray(steps, dtype=np.float64)
    drafts, seconds = data[:, 1], data[:, 2]
    tokens = data[:, 0] - drafts
    spec = (drafts > 0).astype(np.float64)
    varied = np.ptp(tokens) > 0
    if not varied and previous is None:
        return None
    both = 0 < spec.sum() < len(spec)
    apart = both and len(np.unique(drafts[drafts > 0])) >= 2
    x = np.stack([np.ones_like(tokens)] + ([tokens] if varied else []) + ([spec] if apart else []) + (
        [drafts] if both else []), axis=1)
    c1_fixed = 0.0 if varied else previous[1]
    y = seconds - c1_fixed * tokens
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    if drop_spikes:
        spikes = _spikes(x, y, coef, spec, 2 if varied else 1)
        if spikes.any():
            return _least_squares(data[~spikes], previous, drop_spikes=False)
    kept = int(spec.sum())
    coef = list(coef)
    c0 = coef.pop(0)
    c1 = coef.pop(0) if varied else c1_fixed
    c2 = coef.pop(0) if apart else 0.0
    c3 = coef.pop(0) if both else 0.0
    if apart and c2 < 0:  # a negative fixed cost: the extra cost is all per draft token
        return _least_squares_per_draft(tokens, drafts, seconds, varied, c1_fixed), kept
    return (max(1e-6, float(c0)), max(0.0, float(c1)), max(0.0, float(c2)), max(0.0, float(c3))), kept


def _least_squares_per_draft(tokens, drafts, seconds, varied: bool, c1_fixed: float) -> Fit:
    columns = [np.ones_like(tokens)] + ([tokens] if varied else []) + [drafts]
    coef = list(np.linalg.lstsq(np.stack(columns, axis=1), seconds - c1_fixed * tokens, rcond=None)[0])
    c0 = coef.pop(0)
    c1 = coef.pop(0) if varied else c1_fixed
    return max(1e-6, float(c0)), max(0.0, float(c1)), 0.0, max(0.0, float(coef[0]))


def _spikes(x: np.ndarray, y: np.ndarray, coef: np.ndarray, spec: np.ndarray, plain_columns: int) -> np.ndarray:
    """Mask [len(y)] bool of the steps that took more than `_SPIKE_FACTOR` times what the other steps predict for
    them: the leave-one-out prediction y_i - r_i / (1 - h_ii), h the hat matrix's diagonal (Cook & Weisberg,
    Residuals and Influence in Regression, 1982, ch. 2); for a speculative step that alone determines the
    speculative terms (h_ii = 1: the window's only one), the plain step of its tokens (the first `plain_columns`
    terms, which the others determine). One step slowed by something other than its shape (a garbage-collector
    pause, a first-use kernel compile, the host descheduled) otherwise fits as the price of its shape: on the
    H100 at 0b81da5 (spec_decode_h100_replay_0b81da5.json, batch 1, k 5) speculation then stayed off for the rest
    of the run (17% of steps drafted, x1.36 against x3.14 with `always`), since a request's rate changes only by
    speculating and a spike leaves the window only after `_WINDOW` steps. Two steps that agree predict each
    other, so a real new cost is believed from its second observation; a plain step that alone determines a
    term is never flagged."""
    h = np.einsum("ij,ji->i", x, np.linalg.pinv(x))
    residual = y - x @ coef
    alone = h > 1.0 - 1e-6
    predicted = np.where(alone, x[:, :plain_columns] @ coef[:plain_columns],
                         y - residual / np.where(alone, 1.0, 1.0 - h))
    judged = ~alone | (spec > 0)
    return judged & (predicted > 0) & (y > _SPIKE_FACTOR * predicted)
