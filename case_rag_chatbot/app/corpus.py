"""The corpus: Python's own documentation as it ships inside every CPython, chunked for retrieval.

`pydoc_data.topics` (the text behind `help("with")`) holds 79 topics of the Language Reference and of the
built-in types chapter of the Library Reference, about 465,000 characters for Python 3.11: no download,
no extra package, the same bytes on every machine with the same Python minor version. Each topic is split
at its section headings, and each section into chunks of whole paragraphs of at most `max_chars`
characters (Python 3.11: 583 chunks at the default 800, after dropping topics' repeats of each other).

Every chunk carries a URL-like source: the docs.python.org page and anchor of its section (the pages were
read from the anchors in Debian's `python3.11-doc` HTML; subsection anchors are Sphinx's slugs of their
titles). A topic missing from `TOPIC_PAGES` (a newer Python's) gets the docs' search URL for its name.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

DOCS_ROOT = f"https://docs.python.org/{sys.version_info.major}.{sys.version_info.minor}"
DEFAULT_MAX_CHARS = 800  # about 200 tokens: four chunks of context stay under 1k prompt tokens

# docs.python.org page of each pydoc topic label (Sphinx's std labels: the anchor is the label itself).
_PAGES = {
    "library/pdb": ("debugger",),
    "library/stdtypes": ("bltin-code-objects", "bltin-ellipsis-object", "bltin-null-object",
                         "bltin-type-objects", "specialattrs", "string-methods", "truth", "typesfunctions",
                         "typesmapping", "typesmethods", "typesmodules", "typesseq", "typesseq-mutable"),
    "library/string": ("formatstrings",),
    "reference/compound_stmts": ("async", "class", "compound", "else", "for", "function", "if", "try",
                                 "while", "with"),
    "reference/datamodel": ("attribute-access", "callable-types", "context-managers", "customization",
                            "numeric-types", "objects", "sequence-types", "specialnames", "types"),
    "reference/executionmodel": ("dynamic-features", "exceptions", "execmodel", "naming"),
    "reference/expressions": ("atom-identifiers", "atom-literals", "attribute-references", "await", "binary",
                              "bitwise", "booleans", "calls", "comparisons", "conversions", "dict", "exprlists",
                              "in", "lambda", "lists", "operator-summary", "power", "shifting", "slicings",
                              "subscriptions", "unary"),
    "reference/lexical_analysis": ("floating", "id-classes", "identifiers", "imaginary", "integers", "numbers",
                                   "strings"),
    "reference/simple_stmts": ("assert", "assignment", "augassign", "break", "continue", "del", "global",
                               "import", "nonlocal", "pass", "raise", "return", "yield"),
}
TOPIC_PAGES = {topic: page for page, topics in _PAGES.items() for topic in topics}

# A heading is a line of text underlined by one repeated character over its exact length; pydoc's text
# uses * for the topic title, then = - ~ for deeper levels.
_HEADING = re.compile(r"^(?P<title>\S.*)\n(?P<rule>([*=\-~^])\3*)$", re.M)
_LEVELS = "*=-~^"
# Topics whose subsection titles are not sections in the HTML (description-list terms): the topic anchor.
_NO_SUBSECTION_ANCHORS = {"types"}


@dataclass(frozen=True)
class Chunk:
    id: str      # "<topic>/<section slug>/<n>": unique, stable for one Python minor version
    topic: str   # the pydoc topic label, e.g. "with"
    title: str   # section path, e.g. 'Assignment statements › Augmented assignment statements'
    source: str  # docs.python.org URL of the section, e.g. ".../reference/simple_stmts.html#assignment"
    text: str    # the section path, a blank line, then whole paragraphs of the section

    @property
    def embedding_text(self) -> str:
        """The text that is embedded: `text` without its grammar productions (`name ::= ...` blocks),
        which read as noise to a sentence embedder (recall@4 on the dev questions: 18/22 with, 19/22
        without). The prompt still gets the whole `text`."""
        paragraphs = [p for p in re.split(r"\n\s*\n", self.text) if "::=" not in p]
        return "\n\n".join(paragraphs) or self.text


def slug(title: str) -> str:
    """Sphinx's (docutils') anchor for a section title: lower case, runs of other characters as one dash."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def topic_url(topic: str, anchor: str | None = None) -> str:
    page = TOPIC_PAGES.get(topic)
    if page is None:
        return f"{DOCS_ROOT}/search.html?q={topic}"
    return f"{DOCS_ROOT}/{page}.html#{anchor or topic}"


def sections(text: str) -> Iterator[tuple[list[str], str]]:
    """(heading path, body) for each section of one topic, in order; the body excludes nested sections."""
    headings = [m for m in _HEADING.finditer(text) if len(m["rule"]) == len(m["title"])]
    path: list[tuple[int, str]] = []
    start, level_title = 0, None
    for m in [*headings, None]:
        body = text[start : m.start() if m else len(text)].strip("\n")
        if level_title is not None:
            path = [p for p in path if p[0] < level_title[0]] + [level_title]
        if body.strip() or m is None:
            yield [t for _, t in path], body
        if m is not None:
            level_title, start = (_LEVELS.index(m["rule"][0]), m["title"].strip()), m.end()


def _paragraphs(body: str, max_chars: int) -> Iterator[str]:
    """Blank-line-separated paragraphs; one longer than `max_chars` is cut at line ends."""
    for para in re.split(r"\n\s*\n", body):
        if not para.strip():
            continue
        piece = ""
        for line in para.rstrip().split("\n"):
            if piece and len(piece) + len(line) + 1 > max_chars:
                yield piece
                piece = ""
            piece = f"{piece}\n{line}" if piece else line
        if piece:
            yield piece


def _pack(paragraphs: list[str], max_chars: int) -> list[str]:
    """Greedy packing of whole paragraphs up to `max_chars`; a piece under a quarter of that (a "Changed
    in version" note, a sentence introducing a grammar block) joins its neighbour even past the limit."""
    small = max_chars // 4
    packed: list[str] = []
    for para in paragraphs:
        if packed and (len(packed[-1]) + len(para) + 2 <= max_chars or len(packed[-1]) < small):
            packed[-1] += "\n\n" + para
        else:
            packed.append(para)
    if len(packed) > 1 and len(packed[-1]) < small:
        tail = packed.pop()
        packed[-1] += "\n\n" + tail
    return packed


def chunk_topic(topic: str, text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[Chunk]:
    chunks: list[Chunk] = []
    anchors: dict[str, str] = {}  # slug -> the section title that owns it
    for path, body in sections(text):
        title = " › ".join(path) or topic
        # The topic's own title keeps the topic's label as anchor; subsections use their title's slug,
        # unless an earlier section took it (Sphinx then numbers the id: '"except*" clause' after
        # '"except" clause'), where the topic's anchor is the safe link.
        anchor = slug(path[-1]) if len(path) > 1 and topic not in _NO_SUBSECTION_ANCHORS else None
        if anchor is not None and anchors.setdefault(anchor, title) != title:
            anchor = None
        key = f"{topic}/{slug(path[-1]) if path else 'intro'}"
        packed = _pack(list(_paragraphs(body, max_chars)), max_chars)
        for n, part in enumerate(packed):
            chunk_id = f"{key}/{n}"
            while any(c.id == chunk_id for c in chunks):  # two sections with one title in a topic
                chunk_id += "+"
            chunks.append(Chunk(chunk_id, topic, title, topic_url(topic, anchor), f"{title}\n\n{part}"))
    return chunks


def load_chunks(max_chars: int = DEFAULT_MAX_CHARS, topics: list[str] | None = None) -> list[Chunk]:
    """All chunks of the installed Python's pydoc topics (or of the named `topics` only), in topic order.

    Raises:
        KeyError: a name in `topics` is not a pydoc topic.
    """
    from pydoc_data.topics import topics as texts

    names = sorted(texts) if topics is None else topics
    return dedupe([c for name in names for c in chunk_topic(name, texts[name], max_chars)])


def dedupe(chunks: list[Chunk]) -> list[Chunk]:
    """One chunk per distinct body. Some topics repeat others whole ("compound" holds "if", "while", "for",
    "try", "with", ...): the copy under the shortest section path (the specific topic) is kept."""
    best: dict[str, Chunk] = {}
    for c in chunks:
        body = c.text[len(c.title):]
        if body not in best or c.title.count(" › ") < best[body].title.count(" › "):
            best[body] = c
    kept = {c.id for c in best.values()}
    return [c for c in chunks if c.id in kept]
