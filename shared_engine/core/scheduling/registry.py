"""`SchedulingPolicy`: the order in which the scheduler admits waiting requests, and whom it preempts.

The scheduler serves running requests first either way; a policy decides only which waiting requests are
admitted next (`order`, asked once per step before admission) and which running request loses its blocks
when the pool runs dry (`preemption_key`, the largest goes). `on_served` / `on_finished` let a policy
account for service (the fair policy's counters). Imports no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from shared_engine.core.request import Request

_POLICIES: dict[str, type[SchedulingPolicy]] = {}


class SchedulingPolicy:
    """First come, first served (the default; vLLM's `fcfs`): the waiting queue as it stands (arrivals
    at the back, preempted requests at the front), the most recent arrival preempted first."""

    name = "fcfs"
    tracks_service = False  # True: the scheduler calls `on_served` after every step
    yields_long_prefills = False  # True: the scheduler asks `long_prefill_yields` (with a chunk cap set)

    def on_arrival(self, request: Request, waiting: deque[Request]) -> None:
        """A request is about to join `waiting` (not yet in it)."""

    def order(self, waiting: deque[Request], limit: int) -> list[Request] | None:
        """The waiting requests in admission order, or None to keep the queue's order. At most `limit`
        can be admitted this step (free sequence slots): a policy may order only that many and leave the
        rest in arrival order (the next step orders again)."""
        return None

    def long_prefill_yields(self, request: Request, admitted: list[Request]) -> bool:
        """Whether the running `request`, mid-prefill with more than `long_prefill_token_threshold` tokens
        left, sits this step out because of the requests `admitted` in it (their first prefill chunks). Asked
        only when `yields_long_prefills` and the threshold is set."""
        return False

    def share_floor(self) -> float | None:
        """The lowest service counter among the tenants with requests in the scheduler, or None (no counters,
        or fewer than two such tenants): the floor of `over_share_prefill_tokens` (core/share_cap.py)."""
        return None

    def preemption_key(self, request: Request):
        """Sort key over running requests; the largest is preempted first."""
        return request.arrival_order

    def on_served(self, requests: Iterable[Request]) -> None:
        """A step's results were applied to these (unfinished) requests."""

    def on_finished(self, request: Request) -> None:
        """The request left the scheduler (finished or aborted); called before its queue entry goes."""


def check_scheduling_fields(priority, tenant) -> None:
    """A request's policy inputs: `priority` an int, `tenant` a non-empty string or None. Raises `ValueError`."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise ValueError(f"tenant must be a non-empty string or None, got {tenant!r}")


def register_scheduling_policy(name: str):
    def wrap(cls):
        _POLICIES[name] = cls
        return cls

    return wrap


register_scheduling_policy("fcfs")(SchedulingPolicy)


def scheduling_policy_names() -> list[str]:
    from shared_engine.core.scheduling import fair, priority  # noqa: F401  (register the built-ins)

    return sorted(_POLICIES)


def make_scheduling_policy(name: str, **kwargs) -> SchedulingPolicy:
    """Raises `ValueError` for an unknown policy name."""
    names = scheduling_policy_names()
    if name not in _POLICIES:
        raise ValueError(f"unknown scheduling policy {name!r}; available: {names}")
    return _POLICIES[name](**kwargs)
