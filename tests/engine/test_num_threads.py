"""The engine's thread setting: `--num-threads`, else OMP_NUM_THREADS, else the cores this process may use;
applied to torch when the engine is built; `serve` sets the passive OpenMP wait policy unless it is set."""

from __future__ import annotations

import os

import pytest
import torch

from shared_engine.config import EngineConfig
from shared_engine.config.device_config import DeviceConfig, default_num_threads


def test_resolution_order(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert DeviceConfig().resolve_num_threads() == default_num_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert DeviceConfig().resolve_num_threads() == 3
    assert DeviceConfig(num_threads=5).resolve_num_threads() == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")  # not a count: ignored
    assert DeviceConfig().resolve_num_threads() == default_num_threads()
    with pytest.raises(ValueError, match="num_threads"):
        DeviceConfig(num_threads=0)


def test_engine_sets_torch_threads(tiny_model_dir):
    from shared_engine.engine.llm_engine import LLMEngine

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                             num_gpu_blocks_override=32, num_threads=threads))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_serve_sets_the_passive_wait_policy(monkeypatch, given, expected):
    pytest.importorskip("fastapi")
    import shared_engine.__main__ as cli
    from shared_engine.entrypoints.openai import api_server

    if given is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    seen = {}
    monkeypatch.setattr(api_server, "run_server",
                        lambda engine, server: seen.update(policy=os.environ.get("OMP_WAIT_POLICY"),
                                                           threads=engine.device.num_threads))
    assert cli.main(["serve", "--num-threads", "3"]) == 0
    assert seen == {"policy": expected, "threads": 3}


def test_serve_sets_the_policy_before_torch_loads():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: everything `main` imports before it sets the
    variable must leave torch unloaded (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys, shared_engine.__main__, shared_engine.entrypoints.openai.cli_args, "
            "shared_engine.entrypoints.batch.cli_args; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", out.stdout
