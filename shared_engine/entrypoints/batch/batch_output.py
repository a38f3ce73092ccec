"""OpenAI batch output rows and the atomic file write.

A row: `{"id": "batch_req_...", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.
Success: status 200, `body` a chat completion, `error` null. Failure: the status the server would have
answered (400, 404), `body` the OpenAI error envelope `{"error": {message, type, param, code}}`, and
`error` `{"code", "message"}` (OpenAI fills `error` for failures without a response and vLLM always on
failure; filling both lets a reader filter on either). A row whose line had no usable `custom_id` keeps
`custom_id` null and names its line in the message.

The file is written to a temporary name beside the target, flushed and fsynced, then renamed over it
(`os.replace`, atomic on POSIX): a reader sees the whole file or none, never part.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from shared_engine.entrypoints.openai.errors import APIError
from shared_engine.entrypoints.openai.logprobs import TokenText, chat_logprobs
from shared_engine.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionResponse,
    ChatLogprobs,
    ResponseMessage,
)
from shared_engine.entrypoints.openai.serving_base import usage
from shared_engine.entrypoints.openai.streaming import visible_text
from shared_engine.outputs import RequestOutput


def _ids() -> tuple[str, str]:
    hex_ = uuid.uuid4().hex
    return f"batch_req_{hex_}", f"batch-{hex_}"


def success_row(custom_id: str, output: RequestOutput, model_name: str, token_text: TokenText | None,
                top_logprobs: int | None) -> dict:
    row_id, request_id = _ids()
    choices = []
    for c in output.outputs:
        logprobs = None
        if top_logprobs is not None and token_text is not None:
            logprobs = ChatLogprobs(content=chat_logprobs(token_text, c.token_ids, c.logprobs or [], top_logprobs))
        choices.append(ChatChoice(index=c.index, message=ResponseMessage(content=visible_text(c)), logprobs=logprobs,
                                  finish_reason=c.finish_reason, stop_reason=c.stop_reason))
    body = ChatCompletionResponse(id=f"chatcmpl-{request_id}", model=model_name, choices=choices,
                                  usage=usage([output]))
    return {"id": row_id, "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": request_id, "body": body.model_dump(mode="json")},
            "error": None}


def error_row(custom_id: str | None, error: APIError) -> dict:
    row_id, request_id = _ids()
    envelope = error.envelope()
    return {"id": row_id, "custom_id": custom_id,
            "response": {"status_code": error.status, "request_id": request_id, "body": envelope},
            "error": {"code": envelope["error"]["type"], "message": error.message}}


def write_jsonl_atomic(path: Path, rows: Iterable[dict]) -> int:
    """Write rows as JSON lines to `path` atomically; returns the number of rows. The temporary file
    (`.<name>.tmp-<pid>`, same directory, so the rename never crosses filesystems) is removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return count


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
