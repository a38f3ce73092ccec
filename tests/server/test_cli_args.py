"""`serve` flags ↔ YAML keys ↔ EngineConfig / ServerConfig: one name per setting, flags win over YAML."""

from __future__ import annotations

import argparse

import pytest

from shared_engine.entrypoints.openai.cli_args import add_serve_arguments, build_configs


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_flags_yaml_precedence(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("max-num-seqs: 8\nmax_model_len: 256\nport: 9001\nenable_prefix_caching: false\n"
                      "api_key: from-yaml\n")
    engine, server = build_configs(_parse(["--config", str(config), "--max-num-seqs", "4", "--block-size", "32"]))
    assert engine.scheduler.max_num_seqs == 4  # the flag wins
    assert engine.model.max_model_len == 256 and engine.cache.block_size == 32
    assert engine.cache.enable_prefix_caching is False
    assert server.port == 9001 and server.api_key == "from-yaml"
    engine, _ = build_configs(_parse(["my-model-dir", "--no-enable-prefix-caching", "--served-model-name", "x"]))
    assert engine.model.model == "my-model-dir" and engine.model.served_model_name == "x"
    assert engine.cache.enable_prefix_caching is False


def test_every_issue_flag_exists():
    flags = ["--host", "h", "--port", "1", "--max-model-len", "64", "--max-num-seqs", "2",
             "--max-num-batched-tokens", "64", "--block-size", "16", "--gpu-memory-utilization", "0.5",
             "--kv-cache-memory", "1000000", "--num-gpu-blocks-override", "10", "--enable-prefix-caching",
             "--served-model-name", "m", "--api-key", "k", "--dtype", "float32", "--device", "cpu", "--seed", "3",
             "--max-logprobs", "5", "--load-format", "dummy"]
    engine, server = build_configs(_parse(flags))
    assert engine.cache.num_gpu_blocks_override == 10 and engine.model.max_logprobs == 5
    assert server.host == "h" and server.api_key == "k"


def test_bad_yaml_key_and_value(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("max_num_seq: 8\n")
    with pytest.raises(ValueError, match="max_num_seq"):
        build_configs(_parse(["--config", str(config)]))
    with pytest.raises(ValueError, match="block_size"):
        build_configs(_parse(["--block-size", "3"]))


def test_lora_flags_use_vllms_names():
    engine, server = build_configs(_parse([
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8",
        "--lora-modules", "fr=/adapters/fr", "upper=/adapters/upper", "--allow-runtime-lora-updating",
        "--lora-admin-key", "k"]))
    assert engine.lora.enable_lora and engine.lora.max_loras == 4 and engine.lora.max_lora_rank == 64
    assert engine.lora.max_cpu_loras == 8
    assert server.lora_modules == ["fr=/adapters/fr", "upper=/adapters/upper"]
    assert server.allow_runtime_lora_updating and server.resolved_lora_admin_key() == "k"
    with pytest.raises(ValueError, match="max_cpu_loras must be >= 4"):
        build_configs(_parse(["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"]))


def test_fp8_flags_use_vllms_names():
    engine, _ = build_configs(_parse(["--kv-cache-dtype", "fp8", "--quantization", "fp8"]))
    assert engine.cache.kv_cache_dtype == "fp8" and engine.cache.fp8_kv_cache and engine.model.quantization == "fp8"
    engine, _ = build_configs(_parse([]))
    assert engine.cache.kv_cache_dtype == "auto" and not engine.cache.fp8_kv_cache and engine.model.quantization is None
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        build_configs(_parse(["--kv-cache-dtype", "fp8_e5m2"]))
