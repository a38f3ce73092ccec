"""`python -m case_rag_chatbot.app <command>`.

    ingest [--force]                      chunk and embed the corpus into Chroma (skipped when up to date)
    serve [--host H] [--port P] [--no-ingest]   the app (ingests first unless --no-ingest)
    ask "question" [--url URL]            stream one answer from a running app

Configuration is read from the environment (`settings.py`: ENGINE_URL, ENGINE_MODEL, CHROMA_URL,
CHROMA_DIR, SYSTEM_PROMPT_TOKENS, RAG_TOP_K, RAG_MAX_TOKENS, RAG_CONTEXT_FIRST, RAG_CORPUS_TOPICS).
"""

from __future__ import annotations

import argparse
import logging
import sys

from .settings import AppSettings


def run_ingest(settings: AppSettings, force: bool = False, client=None, embedder=None):
    """Ingest the corpus into the settings' collection (a no-op when it is up to date) and print a line."""
    from .corpus import load_chunks
    from .embedder import Embedder
    from .vector_store import connect, ingest

    chunks = [c for c in load_chunks() if not settings.corpus_topics or c.topic in settings.corpus_topics]
    report = ingest(client or connect(settings), settings.collection, chunks, embedder or Embedder(), force=force)
    where = settings.chroma_url or settings.chroma_dir
    state = "already up to date" if report.skipped else f"embedded in {report.seconds:.1f} s"
    print(f"{report.num_chunks} chunks in collection {settings.collection!r} at {where}: {state}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m case_rag_chatbot.app", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_ingest = sub.add_parser("ingest", help="chunk and embed the corpus into Chroma")
    p_ingest.add_argument("--force", action="store_true", help="rebuild even when the collection is up to date")
    p_serve = sub.add_parser("serve", help="run the app")
    p_serve.add_argument("--host", default="127.0.0.1")
    p_serve.add_argument("--port", type=int, default=8080)
    p_serve.add_argument("--no-ingest", action="store_true", help="do not ingest at startup")
    p_ask = sub.add_parser("ask", help="stream one answer from a running app")
    p_ask.add_argument("question")
    p_ask.add_argument("--url", default="http://127.0.0.1:8080")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")

    if args.command == "ask":
        from .client import ask

        answer = ask(args.url, args.question, on_text=lambda t: print(t, end="", flush=True))
        print()
        for s in answer.sources:
            print(f"[{s['n']}] {s['title']}  {s['source']}")
        print(answer.error or answer.done)
        return 1 if answer.error else 0

    settings = AppSettings.from_env()
    if args.command == "ingest":
        run_ingest(settings, args.force)
        return 0
    import uvicorn

    from .embedder import Embedder
    from .server import create_app
    from .vector_store import Retriever, connect

    client, embedder = connect(settings), Embedder()
    if not args.no_ingest:
        run_ingest(settings, client=client, embedder=embedder)
    retriever = Retriever(client, settings.collection, embedder)
    uvicorn.run(create_app(settings, retriever), host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
