"""Fixtures for the RAG case: the corpus ingested into the embedded Chroma store, a retriever, and real
servers (`python -m shared_engine serve` on the default model, `python -m case_rag_chatbot.app serve`
against it), started with the demo's own helpers.

The store lives where the demo keeps it (`$CHROMA_DIR`, default `$SHARED_ENGINE_CACHE/rag_chroma`):
ingestion (about 1-3 minutes of embedding on 2 cores) runs once per machine and is skipped afterwards
while the chunks and the embedding recipe are unchanged (the collection's fingerprint).
"""

from __future__ import annotations

import os

import pytest

from case_rag_chatbot.app.settings import AppSettings
from case_rag_chatbot.demo import start_app, start_engine

# Answers in the server tests stay short: the tests check streaming and sources, not prose.
APP_MAX_TOKENS = 48


@pytest.fixture(scope="session")
def rag_settings() -> AppSettings:
    return AppSettings.from_env({k: v for k, v in os.environ.items() if k != "CHROMA_URL"})


@pytest.fixture(scope="session")
def embedder():
    from case_rag_chatbot.app.embedder import Embedder

    return Embedder()


@pytest.fixture(scope="session")
def chroma_client(rag_settings):
    from case_rag_chatbot.app.vector_store import connect

    return connect(rag_settings)


@pytest.fixture(scope="session")
def ingested(rag_settings, chroma_client, embedder):
    from case_rag_chatbot.app.corpus import load_chunks
    from case_rag_chatbot.app.vector_store import ingest

    return ingest(chroma_client, rag_settings.collection, load_chunks(), embedder)


@pytest.fixture(scope="session")
def retriever(rag_settings, chroma_client, embedder, ingested):
    from case_rag_chatbot.app.vector_store import Retriever

    return Retriever(chroma_client, rag_settings.collection, embedder)


@pytest.fixture(scope="session")
def engine(tmp_path_factory, default_model_dir):
    service = start_engine(tmp_path_factory.mktemp("rag-engine"))
    yield service
    service.stop()


@pytest.fixture(scope="session")
def app(tmp_path_factory, engine, ingested, rag_settings):
    env = {"CHROMA_DIR": str(rag_settings.chroma_dir), "CHROMA_COLLECTION": rag_settings.collection,
           "SYSTEM_PROMPT_TOKENS": "1024", "RAG_MAX_TOKENS": str(APP_MAX_TOKENS)}
    service = start_app(tmp_path_factory.mktemp("rag-app"), engine.url, env)
    yield service
    service.stop()
