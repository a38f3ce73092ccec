"""The case's engine configs load as the engine's own `serve --config` would load them (unknown keys and bad
values raise), and differ where the README says: the first attempt has one adapter slot and FCFS, the fix a
slot per adapter and the fair policy; every served adapter name is some tenant's, every tenant's adapter served."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from case_multilora.app.tenants import TenantRegistry
from shared_engine.entrypoints.openai.cli_args import build_configs

CASE = "case_multilora"


def load(path: str):
    return build_configs(argparse.Namespace(config=f"{CASE}/{path}"))


def test_first_attempt_vs_fix():
    first_engine, first_server = load("first_attempt/config.yaml")
    fix_engine, fix_server = load("config.yaml")
    assert first_engine.lora.max_loras == 1 and first_engine.scheduler.scheduling_policy == "fcfs"
    assert fix_engine.lora.max_loras == len(fix_server.lora_modules) == 4
    assert fix_engine.scheduler.scheduling_policy == "fair"
    # the whales' documents are chunked, so the fair policy can make their chunks yield to a light admission
    fix_scheduler = fix_engine.scheduler
    assert fix_scheduler.long_prefill_token_threshold == 64 and fix_scheduler.max_long_partial_prefills == 1
    # large prompts of tenants over their share get 64 prefill tokens a step in all; the ~38-token questions none
    assert fix_scheduler.over_share_prefill_tokens == 64 and first_engine.scheduler.over_share_prefill_tokens == 0
    assert first_engine.scheduler.long_prefill_token_threshold == 0
    assert first_server.lora_modules == fix_server.lora_modules
    read = lambda name: yaml.safe_load(Path(CASE, name).read_text())
    assert read("the_fix/config.yaml") == read("config.yaml")


def test_h200_config_serves_30_adapters_of_the_briefs_ranks_in_slots():
    engine, server = load("the_fix/config_h200.yaml")
    assert len(server.lora_modules) == 30 and engine.lora.max_loras >= 30
    ranks = sorted({int(m.split("=")[1].split("/r")[1].split("-")[0]) for m in server.lora_modules})
    assert ranks == [8, 16, 64] and engine.lora.max_lora_rank == 64
    assert engine.scheduler.scheduling_policy == "fair" and engine.scheduler.long_prefill_token_threshold == 256
    assert engine.scheduler.over_share_prefill_tokens == 128  # the whales' ~250-token documents are capped


@pytest.mark.parametrize("path", ["config.yaml", "first_attempt/config.yaml"])
def test_every_tenant_adapter_is_served(path):
    _, server = load(path)
    served = {m.split("=")[0] for m in server.lora_modules}
    tenants = TenantRegistry.from_file(f"{CASE}/tenants.yaml").tenants.values()
    assert {t.adapter for t in tenants} <= served
