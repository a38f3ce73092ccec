"""One results file for the whole suite (benchmarks/results/reliability_cpu_smollm2.json): each script
writes its own section, keeping the others, with the machine, commit and command that produced it."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "reliability_cpu_smollm2.json"
SHARED_MACHINE_NOTE = ("this project's 2-core CPUs are shared with other agents' work (tests, builds, other "
                       "servers): load_average_1_5_15_min_at_write (and any load recorded during the run) says "
                       "how busy the machine was; latencies on a busy machine are noisier and slower")


def commit() -> str:
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def machine() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "note": SHARED_MACHINE_NOTE,
            "load_average_1_5_15_min_at_write": [round(x, 2) for x in os.getloadavg()]}


def _module() -> str:
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return spec.name if spec else sys.argv[0]


def write_section(name: str, section: dict, path: Path = RESULTS) -> Path:
    """Merge `section` (plus when, commit, machine, command) into the file under `name`."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("model", "SmolLM2-135M-Instruct (fp32, CPU)")
    data[name] = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit(),
                  "machine": machine(), "command": " ".join(["python", "-m", _module(), *sys.argv[1:]]),
                  **section}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def append_entry(name: str, entry: dict, path: Path = RESULTS) -> Path:
    """Append `entry` (plus when, commit, machine, command) to the list under `name`, keeping earlier ones."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault(name, []).append({"when": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit(),
                                      "machine": machine(),
                                      "command": " ".join(["python", "-m", _module(), *sys.argv[1:]]), **entry})
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def save(name: str, section: dict, path: Path = RESULTS, append_to: str | None = None) -> Path:
    """`write_section(name, ...)`, or with `append_to` `append_entry(append_to, ...)` (a re-run kept beside
    the earlier ones)."""
    return append_entry(append_to, section, path) if append_to else write_section(name, section, path)


def add_append_argument(parser, name: str) -> None:
    parser.add_argument("--append-to", metavar="KEY",
                        help=f"append the run to the list under KEY in the results file instead of replacing '{name}'")


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, in value units per hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mx) * (v - my) for t, v in points) / var * 3600
