"""`priority`: waiting requests by their `priority` (lower first), ties by arrival; the running request
with the largest (priority, arrival) is preempted first (vLLM's `--scheduling-policy priority`).

Unlike vLLM's, a waiting request of higher priority does not preempt running ones to get in: it is only
admitted first as memory and the step's budget allow.
"""

from __future__ import annotations

from collections import deque

from shared_engine.core.request import Request
from shared_engine.core.scheduling.registry import SchedulingPolicy, register_scheduling_policy


def _key(request: Request) -> tuple[int, int]:
    return request.priority, request.arrival_order


@register_scheduling_policy("priority")
class PriorityPolicy(SchedulingPolicy):
    name = "priority"

    def order(self, waiting: deque[Request], limit: int) -> list[Request]:
        return sorted(waiting, key=_key)

    def preemption_key(self, request: Request):
        return _key(request)
