"""The corpus chunker, the prompt builder, the system prompt's sizing and the app's settings: no model, no
server (the system-prompt token counts use the default model's tokenizer)."""

from __future__ import annotations

import sys

import pytest

from case_rag_chatbot.app.client import parse_sse
from case_rag_chatbot.app.corpus import DOCS_ROOT, TOPIC_PAGES, Chunk, chunk_topic, load_chunks, sections, slug
from case_rag_chatbot.app.prompt import CONTEXT_HEADER, build_messages, format_excerpt
from case_rag_chatbot.app.settings import AppSettings
from case_rag_chatbot.app.system_prompt import load_system_prompt, policy_sections

TOPIC = """The "demo" statement
********************

Intro paragraph.

   demo_stmt ::= "demo" expression

First section
=============

Alpha.

Nested part
-----------

Beta.

Second section
==============

Gamma.
"""


@pytest.fixture(scope="module")
def chunks() -> list[Chunk]:
    return load_chunks()


def test_corpus_is_modest_and_ids_are_unique(chunks):
    assert 300 <= len(chunks) <= 3000
    assert len({c.id for c in chunks}) == len(chunks)
    assert all(0 < len(c.text) <= 2000 for c in chunks)


def test_every_chunk_has_a_docs_url_with_an_anchor(chunks):
    for c in chunks:
        assert c.source.startswith(DOCS_ROOT + "/"), c
        if c.topic in TOPIC_PAGES:
            page, anchor = c.source[len(DOCS_ROOT) + 1 :].split(".html#")
            assert page == TOPIC_PAGES[c.topic] and anchor, c


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the page table was read from Python 3.11's docs")
def test_every_topic_has_a_page():
    from pydoc_data.topics import topics

    assert set(topics) == set(TOPIC_PAGES)


def test_sections_follow_the_heading_levels():
    found = [(path, body.strip().splitlines()[0]) for path, body in sections(TOPIC)]
    assert found == [
        (['The "demo" statement'], "Intro paragraph."),
        (['The "demo" statement', "First section"], "Alpha."),
        (['The "demo" statement', "First section", "Nested part"], "Beta."),
        (['The "demo" statement', "Second section"], "Gamma."),
    ]


def test_chunks_carry_titles_anchors_and_skip_grammar_when_embedded():
    chunks = chunk_topic("with", TOPIC)
    assert [c.id for c in chunks] == ["with/the-demo-statement/0", "with/first-section/0", "with/nested-part/0",
                                      "with/second-section/0"]
    assert chunks[0].source.endswith("/reference/compound_stmts.html#with")
    assert chunks[2].source.endswith("/reference/compound_stmts.html#nested-part")
    assert chunks[2].text == 'The "demo" statement › First section › Nested part\n\nBeta.'
    assert "::=" in chunks[0].text and "::=" not in chunks[0].embedding_text
    assert slug('Sequence Types — "list", "tuple", "range"') == "sequence-types-list-tuple-range"


def test_prompt_puts_the_system_prompt_first_by_default():
    excerpts = [format_excerpt(1, "T", "https://x#a", "T\n\nbody one"), format_excerpt(2, "U", "https://y", "two")]
    messages = build_messages("POLICY", excerpts, "Why?")
    assert messages == [
        {"role": "system", "content": f"POLICY\n\n{CONTEXT_HEADER}\n\n[1] T (https://x#a)\nbody one\n\n[2] U (https://y)\ntwo"},
        {"role": "user", "content": "Why?"},
    ]
    first_attempt = build_messages("POLICY", excerpts, "Why?", context_first=True)
    assert first_attempt[0]["content"].startswith(CONTEXT_HEADER)
    assert first_attempt[0]["content"].endswith("\n\nPOLICY")
    assert first_attempt[1] == messages[1]


def test_prompt_builder_is_pure_and_keeps_a_shared_prefix():
    excerpts = ["[1] a", "[2] b"]
    a = build_messages("POLICY", excerpts, "q1")
    b = build_messages("POLICY", ["[1] c"], "q2")
    assert excerpts == ["[1] a", "[2] b"] and a == build_messages("POLICY", excerpts, "q1")
    assert a[0]["content"].startswith("POLICY") and b[0]["content"].startswith("POLICY")
    assert build_messages("POLICY", [], "q") == [{"role": "system", "content": "POLICY"},
                                                {"role": "user", "content": "q"}]


@pytest.fixture(scope="module")
def count_tokens(default_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_system_prompt_is_about_4k_tokens_and_sizes_down_by_whole_sections(count_tokens):
    full = load_system_prompt()
    assert 3800 <= count_tokens(full) <= 4300
    assert load_system_prompt(4096) == full
    small = load_system_prompt(1024)
    assert 700 <= count_tokens(small) <= 1024
    kept = policy_sections(small)
    assert kept == policy_sections(full)[: len(kept)] and len(kept) >= 3
    exact = load_system_prompt(1024, count_tokens=count_tokens)
    assert count_tokens(exact) <= 1024
    with pytest.raises(ValueError, match="smaller than its title block"):
        load_system_prompt(10)


def test_settings_from_env():
    s = AppSettings.from_env({"ENGINE_URL": "http://e:1/v1", "CHROMA_URL": "http://c:2", "RAG_TOP_K": "3",
                              "SYSTEM_PROMPT_TOKENS": "1024", "RAG_CONTEXT_FIRST": "1", "ENGINE_MODEL": ""})
    assert (s.engine_url, s.chroma_url, s.top_k, s.system_prompt_tokens, s.context_first, s.engine_model) == (
        "http://e:1/v1", "http://c:2", 3, 1024, True, None)
    assert AppSettings.from_env({}).engine_url == "http://127.0.0.1:8000/v1"
    assert AppSettings.from_env({}).corpus_topics == ()
    assert AppSettings.from_env({"RAG_CORPUS_TOPICS": "pass, import,"}).corpus_topics == ("pass", "import")
    with pytest.raises(ValueError, match="RAG_TOP_K"):
        AppSettings.from_env({"RAG_TOP_K": "0"})


def test_parse_sse_reads_named_events():
    lines = ["event: sources", 'data: {"sources": []}', "", "event: token", 'data: {"text": "Hi"}', "",
             "event: done", 'data: {"usage": {}}']
    assert parse_sse(lines) == [("sources", {"sources": []}), ("token", {"text": "Hi"}), ("done", {"usage": {}})]
