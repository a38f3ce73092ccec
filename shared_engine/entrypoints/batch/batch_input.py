"""Reading an OpenAI batch input file: one `BatchRow` per non-blank line, each either ready to run or
carrying the 4xx it would have got from the server.

Input lines (conventions.md, OpenAI's batch format): `{"custom_id": str, "method": "POST",
"url": "/v1/chat/completions", "body": {...chat completion request...}}`. Blank lines are skipped.

Errors are per row (a malformed line never fails or shifts the others): bad JSON, a missing or non-string
`custom_id`, another method or url, a body the server would answer with 400, a model the batch does not
serve (404). The one error that refuses the whole file up front is a duplicate `custom_id`
(`DuplicateCustomIdError`): outputs are joined on it, so two rows with one id cannot both be delivered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from shared_engine.engine.tokenizer import render_chat_text
from shared_engine.entrypoints.openai.chat_render import message_dicts
from shared_engine.entrypoints.openai.errors import APIError
from shared_engine.entrypoints.openai.protocol import ChatCompletionRequest
from shared_engine.entrypoints.openai.server_config import ServerConfig
from shared_engine.entrypoints.openai.serving_base import sampling_params_for
from shared_engine.entrypoints.openai.structured import structured_outputs, tool_mode
from shared_engine.sampling_params import SamplingParams

CHAT_URL = "/v1/chat/completions"
SUPPORTED_URLS = (CHAT_URL,)


class DuplicateCustomIdError(ValueError):
    """Two or more rows share a `custom_id`; nothing was run. `duplicates` maps each id to its line numbers."""

    def __init__(self, duplicates: dict[str, list[int]]) -> None:
        shown = ", ".join(f"{cid!r} (lines {', '.join(map(str, lines))})"
                          for cid, lines in list(duplicates.items())[:5])
        more = f" and {len(duplicates) - 5} more" if len(duplicates) > 5 else ""
        super().__init__(f"duplicate custom_id in the batch input: {shown}{more}; each custom_id must be unique "
                         "(outputs are joined on it)")
        self.duplicates = duplicates


@dataclass
class BatchRow:
    """One input line. `line` is 1-based. Exactly one of (`prompt_token_ids` + `params`) and `error`
    is set once `prepare` ran; `error` is the `APIError` the server would have answered with."""

    line: int
    custom_id: str | None
    body: dict | None = None
    request: ChatCompletionRequest | None = None
    prompt_text: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    params: SamplingParams | None = None
    top_logprobs: int | None = None
    error: APIError | None = None


def read_rows(path: Path) -> list[BatchRow]:
    """Parse `path` into rows (no tokenisation yet). Raises `DuplicateCustomIdError` (nothing is run then)
    and `OSError` for an unreadable file."""
    rows, seen = [], {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            row = parse_line(number, text)
            rows.append(row)
            if row.custom_id is not None:
                seen.setdefault(row.custom_id, []).append(number)
    duplicates = {cid: lines for cid, lines in seen.items() if len(lines) > 1}
    if duplicates:
        raise DuplicateCustomIdError(duplicates)
    return rows


def parse_line(number: int, text: str) -> BatchRow:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return BatchRow(number, None, error=APIError(400, f"line {number}: not valid JSON ({e.msg})"))
    if not isinstance(data, dict):
        return BatchRow(number, None, error=APIError(400, f"line {number}: expected a JSON object"))
    cid = data.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return BatchRow(number, None, error=APIError(400, f"line {number}: custom_id must be a non-empty string",
                                                      "custom_id"))
    row = BatchRow(number, cid)
    if data.get("method", "POST") != "POST":
        row.error = APIError(400, f"method must be POST, got {data.get('method')!r}", "method")
    elif data.get("url") not in SUPPORTED_URLS:
        row.error = APIError(400, f"url must be one of {list(SUPPORTED_URLS)}, got {data.get('url')!r}", "url")
    elif not isinstance(data.get("body"), dict):
        row.error = APIError(400, "body must be a JSON object (a chat completion request)", "body")
    else:
        row.body = data["body"]
    return row


def prepare(row: BatchRow, tokenizer, model_name: str, server_config: ServerConfig | None = None) -> None:
    """Validate the body, render the chat template's text and build the sampling parameters; a failure
    becomes the row's `error` (400, or 404 for a model other than `model_name`). Token ids come from
    `encode_rows` (all rows at once); context-length checks after that, against the engine (run_batch.py)."""
    if row.error is not None:
        return
    try:
        req = ChatCompletionRequest.model_validate(row.body)
        if req.model is not None and req.model != model_name:
            raise APIError(404, f"The model `{req.model}` does not exist.", "model")
        if req.stream:
            raise APIError(400, "stream is not supported in a batch", "stream")
        k = (req.top_logprobs or 0) if req.logprobs else None
        if k is None and req.top_logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        if tool_mode(req) is not None:
            raise APIError(400, "tools are not supported in a batch", "tools")
        structured, _ = structured_outputs(req, None)  # response_format: checked by the engine at add_request
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        row.params = sampling_params_for(req, max_tokens, server_config or ServerConfig(), logprobs=k,
                                         structured_outputs=structured)
        try:
            row.prompt_text = render_chat_text(tokenizer, message_dicts(req.messages), req.add_generation_prompt)
        except Exception as e:  # noqa: BLE001 - a template error comes from the row's messages
            raise APIError(400, f"could not apply the chat template: {e}", "messages") from e
        row.request, row.top_logprobs = req, k
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        row.error = APIError(400, f"invalid body: {first.get('msg')} (at {param})", param)
    except APIError as e:
        row.error = e


def encode_rows(rows: list[BatchRow], tokenizer, chunk: int = 1024) -> None:
    """Token ids for every prepared row, encoded `chunk` texts at a time (the fast tokenizer encodes a
    list in parallel: ~10x faster than one call per row on 4 KB tickets); the same ids as
    `apply_chat_template` gives one row."""
    todo = [r for r in rows if r.error is None and r.prompt_text is not None]
    for i in range(0, len(todo), chunk):
        part = todo[i : i + chunk]
        for row, ids in zip(part, tokenizer([r.prompt_text for r in part], add_special_tokens=False)["input_ids"]):
            row.prompt_token_ids, row.prompt_text = list(ids), None
