"""`ChatContentChunks` (streaming.py) writes exactly what the pydantic models would for a token chunk: the
same bytes for every field value a stream's token chunk can carry (unicode, quotes, newlines, no text, a
finish reason, a stop token id or stop string, any choice index)."""

from __future__ import annotations

import pytest

from shared_engine.entrypoints.openai.protocol import ChatChunkChoice, ChatCompletionChunk, DeltaMessage
from shared_engine.entrypoints.openai.streaming import ChatContentChunks, sse


@pytest.mark.parametrize("index,text,finish,stop", [
    (0, " tok", None, None), (0, 'He said "hi"\n\t\\ ok', None, None), (1, "été 🐝 ﬁ \u2028", None, None),
    (0, None, "length", None), (2, "end", "stop", 128009), (0, "", "stop", "</s>"), (0, "x", "abort", None)])
def test_a_token_chunk_is_the_models_bytes(index, text, finish, stop):
    chunk_id, created, model = 'chatcmpl-"ab\\c"', 1796225019, "tenant-adapter/é"
    expected = sse(ChatCompletionChunk(id=chunk_id, created=created, model=model, choices=[ChatChunkChoice(
        index=index, delta=DeltaMessage(content=text), finish_reason=finish, stop_reason=stop)]))
    assert ChatContentChunks(chunk_id, created, model).content(index, text, finish, stop) == expected
