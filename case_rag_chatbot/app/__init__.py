"""The RAG chatbot case's app: corpus and ingestion into Chroma, retrieval, the prompt builder, and the
FastAPI service with its chat page. `python -m case_rag_chatbot.app {ingest,serve,ask}`.

Modules use relative imports only, so the package also imports as plain `app` with `case_rag_chatbot/` on
`sys.path` (the load test reads the prompt order from `app.prompt.build_messages`).
"""
