"""CPU time by process group from /proc (Linux), to say what a phase of a reliability run spent its cores
on: the API server's process, its engine core (and any other descendants), the client, and the machine in
all (other users of a shared machine included)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system seconds of `pid` (its threads included); 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def listening_pid(port: int) -> int | None:
    """The pid of a `shared_engine serve ... --port <port>` process on this machine, if any."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"shared_engine" in args and b"serve" in args and str(port).encode() in args:
            return int(entry.name)
    return None


def machine_busy_s() -> float:
    """Seconds of CPU the whole machine has been busy (all cores, every process), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / _TICK


class CpuMeter:
    """`snapshot()` CPU seconds of `groups` (name -> callable returning pids) plus the machine's busy time;
    `cores(a, b)` the average cores each used between two snapshots."""

    def __init__(self, groups: dict) -> None:
        self.groups = groups

    def snapshot(self) -> dict:
        snap = {name: sum(process_cpu_s(p) for p in pids()) for name, pids in self.groups.items()}
        snap["machine"] = machine_busy_s()
        snap["wall"] = time.monotonic()
        return snap

    @staticmethod
    def cores(a: dict, b: dict) -> dict:
        wall = b["wall"] - a["wall"]
        return {name: round((b[name] - a[name]) / wall, 2) for name in a if name != "wall"}
