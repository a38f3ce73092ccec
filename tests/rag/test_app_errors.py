"""The app in-process with a stub retriever: an engine that cannot be reached ends the stream with an
`error` event after the sources (never a hang or a bare disconnect)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from case_rag_chatbot.app.client import parse_sse
from case_rag_chatbot.app.settings import AppSettings
from case_rag_chatbot.app.vector_store import RetrievedChunk
from case_rag_chatbot.demo import free_port


class StubRetriever:
    def count(self) -> int:
        return 1

    def search(self, question: str, k: int = 4) -> list[RetrievedChunk]:
        return [RetrievedChunk("pass/the-pass-statement/0", 'The "pass" statement',
                               "https://docs.python.org/3.11/reference/simple_stmts.html#pass",
                               'The "pass" statement\n\n"pass" is a null operation.', 0.2)][:k]


def test_unreachable_engine_gives_an_error_event():
    settings = AppSettings(engine_url=f"http://127.0.0.1:{free_port()}/v1", system_prompt_tokens=1024)
    from case_rag_chatbot.app.server import create_app

    with TestClient(create_app(settings, StubRetriever())) as client:
        assert client.get("/health").json()["num_chunks"] == 1
        response = client.post("/chat", json={"question": "What does pass do?"})
        events = parse_sse(response.text.splitlines())
    assert [name for name, _ in events] == ["sources", "error"]
    assert events[0][1]["sources"][0]["source"].endswith("#pass")
    assert events[1][1]["error"]["code"] == 502
