"""What every results file records about where and how it was measured (hardware, versions, commit)."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime


def git_commit() -> str:
    """GIT_COMMIT when set (copies sent to another machine may carry no .git or a stale one), else git's HEAD."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("GIT_COMMIT", "unknown")


def hardware() -> dict:
    import torch

    info = {"cpu": _cpu_model(), "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1_5_15": list(os.getloadavg())}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory, gpu_count=torch.cuda.device_count())
    return info


def environment() -> dict:
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return {"hardware": hardware(), "versions": versions, "commit": git_commit(),
            "date": datetime.now(UTC).isoformat(timespec="seconds")}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
