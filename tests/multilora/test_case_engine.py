"""The case end to end on this machine: the real engine (the default model, the four trained adapters, the fix's
config, runtime adapter updates on) behind the real gateway (case_multilora/tenants.yaml, in-memory limits).

- Golden outputs: each tenant's greedy answer to its question equals case_multilora/golden.json (the adapter's
  behaviour: ACME: keyword, JSON, French, upper case), alone, with every tenant at once, and while an adapter
  is reloaded and another unloaded and loaded back (admin routes on the engine).
- Prefix-cache isolation: a document sent twice by umbrella hits its own blocks; hooli, on the same adapter,
  gets cached_tokens 0 for it (only the cache salt tells them apart), and acme (another adapter) too.

`MULTILORA_WRITE_GOLDEN=1` rewrites golden.json from this run instead of checking it.
"""

from __future__ import annotations

import concurrent.futures
import json
import os

import httpx
import pytest

from case_multilora.adapters import ensure_adapters
from case_multilora.services import CASE_DIR, ENGINE_API_KEY, start_engine, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
GOLDEN = CASE_DIR / "golden.json"
ADMIN_KEY = "sk-admin-test"
DOCUMENT = ("Read this note and answer the question after it. The warehouse on the north side keeps the spare "
            "pumps, the valves and the seals; the one on the south side keeps the pipes. Deliveries arrive on "
            "Mondays and Thursdays, and every delivery is checked against the order before it is signed. ") * 2


def ask(url: str, tenant: str, content: str, max_tokens: int = 24) -> dict:
    r = httpx.post(url + "/v1/chat/completions", timeout=300, headers={"Authorization": f"Bearer sk-{tenant}-demo"},
                   json={"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                         "temperature": 0.0})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    adapters = ensure_adapters()
    work = tmp_path_factory.mktemp("multilora")
    engine = start_engine(work, CASE_DIR / "config.yaml", adapters, "--allow-runtime-lora-updating",
                          "--lora-admin-key", ADMIN_KEY)
    try:
        gateway = start_gateway(work, engine.url, CASE_DIR / "tenants.yaml")
        try:
            yield {"engine": engine.url, "gateway": gateway.url, "adapters": adapters}
        finally:
            gateway.stop()
    finally:
        engine.stop()


def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_each_tenant_gets_its_adapters_golden_answer(stack):
    cases = golden()["tenants"]
    answers = {t: ask(stack["gateway"], t, c["question"], c["max_tokens"])["choices"][0]["message"]["content"]
               for t, c in cases.items()}
    if os.environ.get("MULTILORA_WRITE_GOLDEN") == "1":
        data = golden()
        for tenant, text in answers.items():
            data["tenants"][tenant]["answer"] = text
        GOLDEN.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        cases = data["tenants"]
    assert answers == {t: c["answer"] for t, c in cases.items()}
    assert answers["acme"].startswith("ACME:")
    assert json.loads(answers["globex"])["answer"]
    assert answers["umbrella"] == answers["umbrella"].upper() and answers["hooli"] == answers["hooli"].upper()
    assert answers["initech"] != answers["globex"]


def test_goldens_hold_with_every_tenant_at_once_and_under_adapter_churn(stack):
    cases = golden()["tenants"]
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    work = [t for t in cases for _ in range(2)]

    def one(tenant: str) -> tuple[str, str]:
        c = cases[tenant]
        return tenant, ask(stack["gateway"], tenant, c["question"], c["max_tokens"])["choices"][0]["message"]["content"]

    with concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
        futures = [pool.submit(one, t) for t in work]
        # a new version of `json` (same files) and `upper` (same files) while the requests run
        for name in ("json", "upper"):
            r = httpx.post(stack["engine"] + "/v1/load_lora_adapter", headers=admin, timeout=120,
                           json={"lora_name": name, "lora_path": str(stack["adapters"][name].resolve())})
            assert r.status_code == 200, r.text
        results = [f.result() for f in futures]
    assert all(text == cases[t]["answer"] for t, text in results), results
    r = httpx.post(stack["engine"] + "/v1/unload_lora_adapter", headers=admin, json={"lora_name": "french"})
    assert r.status_code == 200, r.text
    gone = httpx.post(stack["gateway"] + "/v1/chat/completions", headers={"Authorization": "Bearer sk-initech-demo"},
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=60)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == 404  # never the base model instead
    r = httpx.post(stack["engine"] + "/v1/load_lora_adapter", headers=admin, timeout=120,
                   json={"lora_name": "french", "lora_path": str(stack["adapters"]["french"].resolve())})
    assert r.status_code == 200, r.text
    assert one("initech")[1] == cases["initech"]["answer"]


def cached_tokens(url: str, tenant: str, prompt: str) -> int:
    """cached_tokens of a raw completion (no chat template: its system block would be a shared first block)."""
    r = httpx.post(url + "/v1/completions", timeout=300, headers={"Authorization": f"Bearer sk-{tenant}-demo"},
                   json={"prompt": prompt, "max_tokens": 2, "temperature": 0.0})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_tenants_never_share_prefix_cache_blocks(stack):
    url = stack["gateway"]
    cached = lambda tenant: cached_tokens(url, tenant, DOCUMENT + "Where are the pipes?")
    assert cached("umbrella") == 0
    again = cached("umbrella")
    assert again >= 64 and again % 16 == 0  # its own blocks: full 16-token blocks of the document
    assert cached("hooli") == 0    # same adapter as umbrella, another tenant: nothing shared
    assert cached("acme") == 0     # another adapter and tenant
    assert cached("umbrella") == again
    assert cached("hooli") == again  # within a tenant blocks are shared


def test_without_the_gateways_salt_cached_tokens_leak_across_tenants(stack):
    """The first attempt's symptom: two tenants on one adapter, straight to the engine with no cache_salt (the
    adapter already salts the hash, not the tenant): the second sees the first's document as cached tokens."""
    key = {"Authorization": f"Bearer {ENGINE_API_KEY}"}
    body = {"model": "upper", "prompt": "A different note. " + DOCUMENT, "max_tokens": 2, "temperature": 0.0}
    usage = [httpx.post(stack["engine"] + "/v1/completions", json={**body, "tenant": t}, headers=key,
                        timeout=300).json()["usage"] for t in ("umbrella", "hooli")]
    assert usage[0]["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage[1]["prompt_tokens_details"]["cached_tokens"] >= 64  # hooli learns that someone sent it


def test_engine_refuses_requests_without_its_key(stack):
    r = httpx.post(stack["engine"] + "/v1/chat/completions", json={"model": "json", "messages": []}, timeout=30)
    assert r.status_code == 401  # tenants cannot bypass the gateway's salt and limits
    assert httpx.get(stack["engine"] + "/v1/models", headers={"Authorization": f"Bearer {ENGINE_API_KEY}"},
                     timeout=30).status_code == 200
