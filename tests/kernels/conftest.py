"""Kernel tests run on CUDA when present, else on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at conftest import
time (pytest imports this file before the test modules of this folder).
"""

import os
import sys
from pathlib import Path

import pytest
import torch

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:  # plain `pytest` (not `python -m pytest`) does not add the cwd
    sys.path.insert(0, _REPO_ROOT)

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    """Skip gpu-marked tests of this folder when there is no CUDA (a root conftest may do it too)."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and "tests/kernels" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return DEVICE
