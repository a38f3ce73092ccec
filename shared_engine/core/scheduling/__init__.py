"""Scheduling policies: the order in which waiting requests are admitted (`--scheduling-policy`)."""

from shared_engine.core.scheduling.registry import (
    SchedulingPolicy,
    check_scheduling_fields,
    make_scheduling_policy,
)

__all__ = ["SchedulingPolicy", "check_scheduling_fields", "make_scheduling_policy"]
