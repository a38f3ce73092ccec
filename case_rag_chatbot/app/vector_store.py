"""The Chroma collection that holds the corpus: connect (embedded or server), ingest, search.

Embedded by default (`chromadb.PersistentClient` on `CHROMA_DIR`); a Chroma server when `CHROMA_URL` is
set (`chromadb.HttpClient`, as in docker-compose). Vectors are computed here with `Embedder` and handed to
Chroma, so Chroma's own default embedding function (which would download a model) is never used. The
collection uses cosine distance on normalised vectors.

Ingestion is idempotent: the collection's metadata records a fingerprint of the chunks and the embedding
model, and `ingest` returns at once when it matches (`force=True` rebuilds).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from .corpus import Chunk
from .embedder import MODEL_NAME, Embedder
from .settings import AppSettings

logger = logging.getLogger(__name__)
ADD_BATCH = 256
EMBEDDING_RECIPE = "embedding_text-v1"  # bump when Chunk.embedding_text changes


@dataclass(frozen=True)
class RetrievedChunk:
    id: str
    title: str
    source: str      # docs.python.org URL of the chunk's section
    text: str
    distance: float  # cosine distance, 0 = same direction (smaller is closer)


@dataclass(frozen=True)
class IngestReport:
    num_chunks: int
    seconds: float
    skipped: bool  # the collection already held these chunks


def connect(settings: AppSettings):
    """A Chroma client: HTTP when `settings.chroma_url` is set, else embedded in `settings.chroma_dir`."""
    import chromadb
    from chromadb.config import Settings

    chroma_settings = Settings(anonymized_telemetry=False)
    if settings.chroma_url:
        url = urlparse(settings.chroma_url)
        return chromadb.HttpClient(host=url.hostname or "127.0.0.1", port=url.port or 8000,
                                   ssl=url.scheme == "https", settings=chroma_settings)
    settings.chroma_dir.mkdir(parents=True, exist_ok=True)
    return chromadb.PersistentClient(path=str(settings.chroma_dir), settings=chroma_settings)


def fingerprint(chunks: Sequence[Chunk]) -> str:
    """Changes with the chunks, the embedding model, or what of a chunk is embedded (`EMBEDDING_RECIPE`)."""
    digest = hashlib.sha256(f"{MODEL_NAME}/{EMBEDDING_RECIPE}".encode())
    for c in chunks:
        digest.update(f"\0{c.id}\0{c.source}\0{c.text}".encode())
    return digest.hexdigest()[:16]


def ingest(client, name: str, chunks: Sequence[Chunk], embedder: Embedder, force: bool = False) -> IngestReport:
    """Embed `chunks` into collection `name`, replacing whatever it held, unless it already holds them."""
    started = time.perf_counter()
    print_ = fingerprint(chunks)
    existing = {c.name if hasattr(c, "name") else c for c in client.list_collections()}
    if name in existing and not force:
        collection = client.get_collection(name, embedding_function=None)
        if (collection.metadata or {}).get("fingerprint") == print_ and collection.count() == len(chunks):
            return IngestReport(len(chunks), time.perf_counter() - started, skipped=True)
    if name in existing:
        client.delete_collection(name)
    collection = client.create_collection(
        name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}},
        metadata={"fingerprint": print_, "embedding_model": MODEL_NAME, "num_chunks": len(chunks)})
    for start in range(0, len(chunks), ADD_BATCH):
        batch = chunks[start : start + ADD_BATCH]
        collection.add(ids=[c.id for c in batch], embeddings=embedder.embed([c.embedding_text for c in batch]),
                       documents=[c.text for c in batch],
                       metadatas=[{"topic": c.topic, "title": c.title, "source": c.source} for c in batch])
        logger.info("embedded %d/%d chunks", min(start + ADD_BATCH, len(chunks)), len(chunks))
    return IngestReport(len(chunks), time.perf_counter() - started, skipped=False)


class Retriever:
    """Top-k search over one collection. `search` is synchronous (Chroma and the embedder are)."""

    def __init__(self, client, name: str, embedder: Embedder) -> None:
        self.collection = client.get_collection(name, embedding_function=None)
        self.embedder = embedder

    def count(self) -> int:
        return self.collection.count()

    def search(self, question: str, k: int = 4) -> list[RetrievedChunk]:
        """The `k` chunks closest to `question`, closest first."""
        result = self.collection.query(query_embeddings=self.embedder.embed([question]), n_results=k,
                                       include=["documents", "metadatas", "distances"])
        rows = zip(result["ids"][0], result["documents"][0], result["metadatas"][0], result["distances"][0])
        return [RetrievedChunk(id_, meta["title"], meta["source"], doc, float(dist))
                for id_, doc, meta, dist in rows]
