"""Multi-LoRA over HTTP (one `serve` subprocess, default model): the `model` field picks the adapter, unknown
names are 404s, /v1/models lists adapters under their base, the runtime admin routes load, reload and
unload adapters behind their own key, bad adapters are 400s that leave the server healthy, an unload or
reload never changes a request already running, and the residency gauge names the adapters."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest

from shared_engine.lora.adapter_factory import write_random_adapter
from shared_engine.model_arch import ModelArch
from tests.lora.conftest import peft_greedy
from tests.server.conftest import _stop, start_server

USER, ADMIN = "user-key", "admin-key"
QUESTION = "Name three rivers in Europe."
LONG = ("You are the support assistant of a regional train company. Travellers ask about delays, refunds, "
        "bicycles on board, night trains, season tickets and lost property. Answer in two sentences and "
        "never promise a refund. Question: can I take a folding bike on the night train to Vienna?")
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def srv(tmp_path_factory, adapter_dirs):
    root = adapter_dirs["qv8"].parent
    proc, server = start_server(
        tmp_path_factory.mktemp("lora-server"), "--max-model-len", "512", "--enable-lora", "--max-loras", "2",
        "--max-cpu-loras", "3", "--max-lora-rank", "16", "--allowed-local-lora-path", str(root),
        "--lora-modules", "qv8=qv8", "all16=all16", "--allow-runtime-lora-updating", "--lora-admin-key", ADMIN,
        "--api-key", USER)
    yield server
    _stop(proc)


def user(srv, path, body):
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {USER}"}, timeout=120)


def admin(srv, path, body, key=ADMIN):
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def complete(srv, model, prompt, max_tokens=MAX_TOKENS):
    r = user(srv, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def models(srv) -> dict[str, dict]:
    r = httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {USER}"})
    return {m["id"]: m for m in r.json()["data"]}


@pytest.fixture(scope="module")
def tok(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def refs(default_model_dir, adapter_dirs, tok):
    """PEFT merged-model greedy text for QUESTION and LONG, per adapter (None: base)."""
    prompts = [tok.encode(QUESTION), tok.encode(LONG)]
    out = {}
    for name in [None, "qv8", "all16"]:
        seqs = peft_greedy(default_model_dir, None if name is None else adapter_dirs[name], prompts, MAX_TOKENS)
        out[name] = [tok.decode(s, skip_special_tokens=True) for s in seqs]  # the server drops the EOS
    return out


def text(body) -> str:
    return body["choices"][0]["text"]


def test_models_lists_adapters_with_parent(srv):
    cards = models(srv)
    assert cards["qv8"]["parent"] == srv.model and cards["all16"]["parent"] == srv.model
    assert cards[srv.model].get("parent") is None


def test_model_field_picks_adapter_in_a_mixed_batch(srv, refs):
    names = [None, "qv8", "all16"] * 2
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        bodies = list(pool.map(lambda n: complete(srv, n or srv.model, QUESTION), names))
    for name, body in zip(names, bodies):
        assert text(body) == refs[name][0], name
        assert body["model"] == (name or srv.model)  # the adapter's name, as vLLM answers


def test_responses_echo_the_adapter_name(srv):
    """`model` in every response and stream chunk is the requested adapter's name (the base model's name for
    the base), for completions and chat, streamed or not."""
    chat = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 3, "temperature": 0}
    for name in ["qv8", "all16", srv.model]:
        assert complete(srv, name, QUESTION, max_tokens=3)["model"] == name
        r = user(srv, "/v1/chat/completions", {**chat, "model": name})
        assert r.status_code == 200 and r.json()["model"] == name, r.text
        for path, body in [("/v1/completions", {"prompt": QUESTION, "max_tokens": 3}), ("/v1/chat/completions", chat)]:
            r = user(srv, path, {**body, "model": name, "stream": True,
                                 "stream_options": {"include_usage": True}})
            chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            assert len(chunks) >= 3 and {c["model"] for c in chunks} == {name}, (path, name, chunks)


def test_unknown_adapter_is_404_never_the_base(srv):
    r = user(srv, "/v1/completions", {"model": "no-such-adapter", "prompt": QUESTION, "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == 404 and r.json()["error"]["param"] == "model"
    r = user(srv, "/v1/chat/completions", {"model": "QV8", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404


def test_isolation_and_cached_tokens(srv, refs):
    cached = []
    for name in ["qv8", "all16", None, "all16"]:
        body = complete(srv, name or srv.model, LONG)
        assert text(body) == refs[name][1], name
        cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached[:3] == [0, 0, 0] and cached[3] >= 48


def test_admin_routes_need_their_own_key(srv):
    body = {"lora_name": "k", "lora_path": "qv8"}
    assert admin(srv, "/v1/load_lora_adapter", body, key=USER).status_code == 401
    assert httpx.post(srv.url + "/v1/load_lora_adapter", json=body).status_code == 401
    # and the admin key is not a users' key
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                   headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 401
    assert "k" not in models(srv)


def test_runtime_load_reload_unload(srv, refs):
    """H16/H18: load "x" from A, run, reload "x" from B (a new version: B's output, nothing cached),
    unload: gone from /v1/models and 404."""
    assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "qv8"}).status_code == 200
    assert models(srv)["x"]["parent"] == srv.model
    assert text(complete(srv, "x", LONG)) == refs["qv8"][1]
    r = admin(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "all16"})
    assert r.status_code == 200, r.text
    body = complete(srv, "x", LONG)
    assert text(body) == refs["all16"][1]
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert admin(srv, "/v1/unload_lora_adapter", {"lora_name": "x"}).status_code == 200
    assert "x" not in models(srv)
    assert user(srv, "/v1/completions", {"model": "x", "prompt": LONG, "max_tokens": 2}).status_code == 404
    assert admin(srv, "/v1/unload_lora_adapter", {"lora_name": "x"}).status_code == 404


def test_unload_and_reload_while_a_request_runs(srv, refs):
    """A streaming request on "y" keeps its adapter while "y" is unloaded and reloaded with other weights."""
    assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "y", "lora_path": "qv8"}).status_code == 200
    solo = text(complete(srv, "y", QUESTION, max_tokens=48))
    pieces, mark = [], None
    body = {"model": "y", "prompt": QUESTION, "max_tokens": 48, "temperature": 0, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {USER}"}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            pieces.append(json.loads(line[6:])["choices"][0]["text"])
            if len(pieces) == 2:  # mid-stream: unload, reload from other weights, and use the new version
                assert admin(srv, "/v1/unload_lora_adapter", {"lora_name": "y"}).status_code == 200
                assert user(srv, "/v1/completions", {"model": "y", "prompt": "a", "max_tokens": 1}).status_code == 404
                assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "y", "lora_path": "all16"}).status_code == 200
                assert text(complete(srv, "y", QUESTION)) == refs["all16"][0]
                mark = len(pieces)
    assert mark is not None and len(pieces) > mark + 5  # most of the request ran after the swap
    assert "".join(pieces) == solo
    admin(srv, "/v1/unload_lora_adapter", {"lora_name": "y"})


def test_bad_adapters_are_400_and_the_server_stays_healthy(srv, adapter_dirs, tiny_model_dir, default_model_dir,
                                                           refs):
    root = adapter_dirs["qv8"].parent
    write_random_adapter(root / "rank32", ModelArch.from_dir(default_model_dir), 32, ["q_proj"], layers=[0])
    write_random_adapter(root / "tiny", ModelArch.from_dir(tiny_model_dir), 4, ["q_proj"])
    (root / "empty").mkdir(exist_ok=True)
    unknown = write_random_adapter(root / "unknown", ModelArch.from_dir(default_model_dir), 4, ["q_proj"], layers=[0])
    cfg = json.loads((unknown / "adapter_config.json").read_text())
    (unknown / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": ["q_proj", "lm_head"]}))
    before = set(models(srv))
    cases = [("rank32", "rank 32 exceeds max_lora_rank 16"), ("tiny", "expected"), ("empty", "adapter_config.json"),
             ("unknown", "lm_head"), ("../" + root.name + "/../..", "outside the allowed adapter directory"),
             ("/etc", "outside the allowed adapter directory")]
    for path, message in cases:
        r = admin(srv, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": path})
        assert r.status_code == 400, (path, r.text)
        assert message in r.json()["error"]["message"], (path, r.json())
    r = admin(srv, "/v1/load_lora_adapter", {"lora_name": "", "lora_path": "qv8"})
    assert r.status_code == 400 and "lora_name" in r.json()["error"]["message"]
    assert set(models(srv)) == before
    assert httpx.get(srv.url + "/health").status_code == 200
    assert text(complete(srv, "qv8", QUESTION)) == refs["qv8"][0]


def test_residency_gauge(srv):
    complete(srv, "qv8", QUESTION, max_tokens=2)
    metrics = httpx.get(srv.url + "/metrics").text.splitlines()
    lines = [ln for ln in metrics if ln.startswith("vllm:lora_requests_info{")]
    assert len(lines) == 1
    assert 'max_lora="2"' in lines[0] and "resident_lora_adapters=" in lines[0] and "qv8" in lines[0]
    assert 'running_lora_adapters=""' in lines[0]



def test_startup_refuses_a_bad_module_naming_rank_and_limit(tiny_model_dir, tmp_path):
    """H19 at startup: --lora-modules with a rank over --max-lora-rank stops the server before it serves."""
    from shared_engine.config import EngineConfig
    from shared_engine.engine.llm_engine import LLMEngine
    from shared_engine.entrypoints.openai.api_server import create_app
    from shared_engine.entrypoints.openai.server_config import ServerConfig

    write_random_adapter(tmp_path / "r16", ModelArch.from_dir(tiny_model_dir), 16, ["q_proj"])
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64, max_model_len=256, enable_lora=True,
                                              max_lora_rank=8))
    with pytest.raises(ValueError, match="r16=.*rank 16 exceeds max_lora_rank 8"):
        create_app(engine, ServerConfig(lora_modules=[f"r16={tmp_path / 'r16'}"]))
    with pytest.raises(ValueError, match="needs --lora-admin-key"):
        create_app(engine, ServerConfig(allow_runtime_lora_updating=True))
