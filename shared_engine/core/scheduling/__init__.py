"""Scheduling policies: the order in which waiting requests are admitted (`--scheduling-policy`)."""

from shared_engine.core.scheduling.registry import SchedulingPolicy, make_scheduling_policy

__all__ = ["SchedulingPolicy", "make_scheduling_policy"]
