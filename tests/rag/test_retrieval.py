"""Retrieval over the real corpus in the embedded Chroma store: the held-out questions find their source in
the top 4 (the app's default `RAG_TOP_K`), and recall on the development questions does not regress."""

from __future__ import annotations

import pytest

from tests.rag.questions import DEV, HELD_OUT, Question

TOP_K = 4


def answered(retriever, question: Question) -> bool:
    return any(question.answered_by(c.id, c.source) for c in retriever.search(question.text, TOP_K))


def test_store_holds_the_whole_corpus(retriever, ingested):
    assert retriever.count() == ingested.num_chunks >= 300


@pytest.mark.parametrize("question", HELD_OUT, ids=[q.text[:48] for q in HELD_OUT])
def test_held_out_question_retrieves_its_source(retriever, question):
    found = retriever.search(question.text, TOP_K)
    assert any(question.answered_by(c.id, c.source) for c in found), [(c.id, c.source) for c in found]
    assert [c.distance for c in found] == sorted(c.distance for c in found)


def test_dev_recall_at_4_does_not_regress(retriever):
    hits = sum(answered(retriever, q) for q in DEV)
    assert hits >= 19, f"recall@4 on the dev questions fell to {hits}/{len(DEV)} (was 19/22)"
