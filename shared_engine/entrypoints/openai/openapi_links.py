"""OpenAPI links between the server's operations, so that clients and stateful fuzzers (schemathesis'
stateful phase, tests/server/test_schemathesis.py) can chain calls with real values: the model id that
`GET /v1/models` lists feeds every route taking `model`; `/tokenize`'s tokens feed `/detokenize`; a
generation's text feeds `/tokenize` and the next completion. Each link's `requestBody` holds runtime
expressions (OpenAPI 3.0 "Link Object") merged into an otherwise generated body.
"""

from __future__ import annotations

MODEL = {"model": "$response.body#/data/0/id"}

# (source path, method) -> [(link name, target path, method, requestBody)], all on the 200 response.
LINKS: dict[tuple[str, str], list[tuple[str, str, str, dict]]] = {
    ("/v1/models", "get"): [
        ("CompletionWithListedModel", "/v1/completions", "post", MODEL),
        ("ChatWithListedModel", "/v1/chat/completions", "post", MODEL),
        ("TokenizeWithListedModel", "/tokenize", "post", MODEL),
        ("DetokenizeWithListedModel", "/detokenize", "post", MODEL),
    ],
    ("/tokenize", "post"): [
        ("DetokenizeTheTokens", "/detokenize", "post", {"tokens": "$response.body#/tokens"}),
    ],
    ("/v1/completions", "post"): [
        ("TokenizeTheCompletion", "/tokenize", "post", {"prompt": "$response.body#/choices/0/text"}),
        ("ContinueTheCompletion", "/v1/completions", "post", {"prompt": "$response.body#/choices/0/text"}),
    ],
    ("/v1/chat/completions", "post"): [
        ("TokenizeTheAnswer", "/tokenize", "post", {"prompt": "$response.body#/choices/0/message/content"}),
    ],
}


def add_links(schema: dict) -> dict:
    """Add `LINKS` to `schema` (in place) wherever both operations exist; returns the schema."""
    paths = schema.get("paths", {})
    for (path, method), links in LINKS.items():
        source = paths.get(path, {}).get(method)
        if source is None or "200" not in source.get("responses", {}):
            continue
        out = source["responses"]["200"].setdefault("links", {})
        for name, target_path, target_method, body in links:
            target = paths.get(target_path, {}).get(target_method)
            if target is not None and target.get("operationId"):
                out[name] = {"operationId": target["operationId"], "requestBody": body}
    return schema
