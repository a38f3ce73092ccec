"""`serve` flags ↔ YAML keys ↔ `EngineConfig` / `ServerConfig`.

Every setting has one name: `--max-num-seqs` on the command line, `max_num_seqs` in the YAML file
(`--config FILE.yaml`) and in Python. Engine flags are generated from the config dataclasses, so a new
config field is a new flag and YAML key at once. Precedence: defaults < YAML < flags. Imports no server
packages (so `serve --help` works without them).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from shared_engine.config import EngineConfig
from shared_engine.config.engine_config import _SECTIONS
from shared_engine.entrypoints.openai.server_config import ServerConfig

_HELP = {
    "model": "model directory or preset (default: the embedded SmolLM2-135M-Instruct)",
    "max_model_len": "longest prompt + output per request, in tokens (default: from the model config)",
    "max_num_seqs": "most sequences in one step",
    "max_num_batched_tokens": "per-step token budget (default 8192)",
    "max_waiting_requests": "waiting sequences at which new requests get 503 + Retry-After (default 1024)",
    "block_size": "tokens per KV block",
    "gpu_memory_utilization": "fraction of device memory the engine may claim (CUDA)",
    "kv_cache_memory": "KV cache size in bytes (default on CPU: 2 GiB)",
    "num_gpu_blocks_override": "fixed KV pool size in blocks",
    "served_model_name": "name in responses and the model_name metric label (default: the model)",
    "api_key": "bearer token required on every route but --api-key-exempt-paths (env fallback: "
    "SHARED_ENGINE_API_KEY, VLLM_API_KEY)",
    "api_key_exempt_paths": "comma-separated paths served without the API key (default: /health,/metrics)",
    "max_stop_strings": "most stop strings per request (default 16)",
    "max_stop_string_len": "longest stop string, in characters (default 256)",
    "max_stop_token_ids": "most stop_token_ids per request (default 64)",
    "max_prompts_per_request": "most prompts in one completions request (default 64)",
    "max_prompt_tokens_per_request": "most prompt tokens per request, summed over its sequences (default 131072)",
    "max_chat_messages": "most chat messages per request, counted before validation (default 2048, OpenAI's)",
    "max_content_parts": "most content parts per chat request, summed over its messages (default 2048)",
    "large_input_bytes": "requests with more input bytes (body or prompts) are tokenised in a lane of their own, "
    "so that small requests never wait behind them (default 65536)",
    "max_large_inputs": "most such large requests being tokenised or waiting; more get 503 + Retry-After "
    "(default 4)",
    "max_header_bytes": "largest request line + headers in bytes; larger get 431 (default 32768)",
    "max_headers": "most request headers; more get 431 (default 100)",
    "header_read_timeout_s": "seconds a connection may take to send a request head (from connecting, or from "
    "the previous response's end); then 408 and closed (slowloris; default 10)",
    "body_read_timeout_s": "seconds a request body may take to arrive after its headers; then 408 and closed "
    "(default 30)",
    "max_connections": "most open connections; past it a new one gets 503 and is closed (default 2048)",
    "health_timeout_s": "/health answers 503 when the engine has work and no step finished for this long "
    "(a hung step; default 60)",
    "max_request_body_bytes": "larger request bodies get 413",
    "cache_salt_from_api_key": "derive each request's cache_salt from the API key it presents (HMAC under "
    "--cache-salt-secret), so tenants never share prefix-cache blocks",
    "cache_salt_secret": "secret for --cache-salt-from-api-key (env fallback: SHARED_ENGINE_CACHE_SALT_SECRET; "
    "default: random per process)",
    "max_n": "largest n accepted",
    "max_logprobs": "cap on logprobs / top_logprobs",
    "num_threads": "torch intra-op (OpenMP) threads of the engine (default: OMP_NUM_THREADS if set, else the "
    "cores this process may use); serve also sets OMP_WAIT_POLICY=PASSIVE unless it is set",
    "nano_batch_min_decodes": "CUDA: decode-only steps of at least this many rows run as two nano-batches on two "
    "streams, one's attention overlapping the other's GEMMs (NanoFlow; model_executor/nano_batch.py; 0: off)",
    "disable_frontend_multiprocessing": "run the engine in the API server's process (a thread) instead of "
    "its own engine core process",
    "cuda_graph_max_prefill_tokens": "CUDA: steps with up to this many prefill tokens (and decodes) replay a "
    "CUDA graph; 0 graphs decode-only steps only",
    "enable_async_output_proc": "process step n's outputs (detokenisation, stop strings) after launching step n+1 "
    "(vLLM V0's async output processing; outputs reach clients one step later; engine/async_output.py)",
    "async_scheduling": "schedule and launch step n+1 before step n's sampled tokens reach the host, so the "
    "device does not wait for scheduling or input building (vLLM's flag; implies async output processing; "
    "default: on for CUDA, off on the CPU; engine/async_output.py)",
    "max_num_partial_prefills": "most requests mid-prefill at once (chunked prefill; default: no cap)",
    "max_long_partial_prefills": "most of those whose uncached prompt is longer than "
    "--long-prefill-token-threshold, so short prompts keep a slot (default: no cap)",
    "long_prefill_token_threshold": "a prompt with more uncached tokens is long, and gets at most this many "
    "tokens per step (0: off); with --scheduling-policy fair a running long prompt also sits out a step that "
    "admits another tenant's request whose counter is not above its own (core/scheduling/fair.py)",
    "scheduling_policy": "order of admission of waiting requests: fcfs (arrival), priority (the request's "
    "priority, lower first) or fair (per-tenant virtual token counters, VTC; the request's tenant field)",
    "over_share_prefill_tokens": "with --scheduling-policy fair: while two or more tenants have requests, "
    "prompts of more uncached tokens than this from tenants served more than the least-served one get at most "
    "this many prefill tokens per step in all, and sit out a step that admits a less-served tenant's request "
    "(0: off; core/share_cap.py)",
    "session_pin_ttl": "seconds a finished turn's cached prefix stays pinned (not evictable) while its session "
    "(X-Session-Id) may send the next turn (Continuum's KV time-to-live; 0: off)",
    "max_pinned_blocks": "most KV block references held by session pins, oldest released first (default: half "
    "the pool)",
    "kv_offload_size": "GiB of host memory (pinned on CUDA, per rank) holding prefix-cache blocks evicted from the "
    "GPU pool, copied back on a prefix hit instead of recomputed (0: off; needs prefix caching)",
    "enable_lora": "serve LoRA adapters (requests pick one by their model field)",
    "max_loras": "GPU adapter slots: most distinct adapters among running requests",
    "max_lora_rank": "largest adapter rank accepted (each slot's size)",
    "max_cpu_loras": "adapters kept in the CPU cache (default: max_loras)",
    "allowed_local_lora_path": "adapter paths must resolve inside this directory",
    "lora_kernel": "CUDA LoRA kernels: sgmv (tokens grouped by adapter, weights read once per tile) or bgmv "
    "(weights read once per token)",
    "lora_slot_stream": "CUDA: load adapter slots on a copy stream of their own, ordered by events against the "
    "steps that read them (not yet measured on a GPU)",
    "lora_modules": "adapters served from the start, as name=path",
    "allow_runtime_lora_updating": "enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter",
    "lora_admin_key": "bearer token for the LoRA admin routes (env fallback: SHARED_ENGINE_LORA_ADMIN_KEY)",
    "tensor_parallel_size": "GPUs (CPU: processes) that each layer is sharded over, one worker process per rank "
    "(torch.distributed: NCCL on CUDA, gloo on the CPU; README 'Tensor parallelism')",
    "kv_cache_dtype": "KV cache element type: auto (the model's dtype) or fp8 (= fp8_e4m3: float8_e4m3fn with "
    "per-layer K/V scales, 1 byte per element: twice bf16's tokens in the same memory)",
    "quantization": "fp8: the decoder's linear layers quantised at load to float8_e4m3fn (per-output-channel "
    "weight scales, dynamic per-token activation scales, torch._scaled_mm; CUDA with compute capability >= 8.9 "
    "only)",
    "disable_cascade_attn": "CUDA: no cascade attention (decodes sharing a prefix-cached prompt prefix of >= 256 "
    "tokens read it once per batch, not once per sequence)",
}


def _engine_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for klass in _SECTIONS.values() for f in dataclasses.fields(klass)}


def _server_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(ServerConfig)}


def _add_flag(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
    flag = "--" + field.name.replace("_", "-")
    kind = str(field.type)
    kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS, "help": _HELP.get(field.name)}
    if kind.startswith("bool"):
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        return
    kwargs["type"] = int if kind.startswith("int") else float if kind.startswith("float") else str
    parser.add_argument(flag, **kwargs)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=argparse.SUPPRESS, help=_HELP["model"])
    parser.add_argument("--config", type=Path, default=None, help="YAML file whose keys are the flag names")
    for field in _server_fields().values():
        if field.name == "lora_modules":
            parser.add_argument("--lora-modules", dest="lora_modules", nargs="+", default=argparse.SUPPRESS,
                                metavar="NAME=PATH", help=_HELP["lora_modules"])
            continue
        _add_flag(parser, field)
    for name, field in _engine_fields().items():
        if name != "model":
            _add_flag(parser, field)


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a config file; keys may use dashes or underscores.

    Raises:
        ValueError: not a mapping, or an unknown key.
    """
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of setting names to values")
    settings = {str(k).replace("-", "_"): v for k, v in data.items()}
    known = set(_engine_fields()) | set(_server_fields())
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {unknown}; known: {sorted(known)}")
    return settings


def build_configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """Defaults < YAML < flags. Raises `ValueError` for unknown keys or out-of-range values."""
    given = {k: v for k, v in vars(args).items() if k not in ("config", "command")}
    settings = load_yaml(args.config) if getattr(args, "config", None) else {}
    settings.update(given)
    server_names = set(_server_fields())
    server = ServerConfig(**{k: v for k, v in settings.items() if k in server_names})
    engine = EngineConfig.from_flat(**{k: v for k, v in settings.items() if k not in server_names})
    return engine, server
