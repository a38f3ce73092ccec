"""The case's workload (`case_rag_chatbot/workload.yaml`) as token-id requests.

`CaseProfile` is one profile of the file (`h200`: the brief's scale; `cpu`: scaled down). `RequestSampler`
draws one chat turn: a RAG turn (the shared system prompt, `context.chunks` chunks drawn from a fixed corpus
of `corpus_chunks` chunks, a question) or, with probability `document_share`, a document turn (the system
prompt, a pasted one-off document, a question). Segments are random token ids laid out in the app's prompt
order (`prompt_builder.segment_order`); each request records where its system prompt sits, so the
system-prompt hit rate can be computed from the server's per-request `cached_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CASE_DIR = Path(__file__).resolve().parents[1]
WORKLOAD_FILE = CASE_DIR / "workload.yaml"
FIRST_TOKEN_ID = 100  # keep special ids (BOS, EOS, chat markers sit low in most vocabularies) out of prompts


@dataclass(frozen=True)
class Range:
    min: int
    max: int

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.min, self.max + 1))

    @property
    def mean(self) -> float:
        return (self.min + self.max) / 2


@dataclass(frozen=True)
class CaseProfile:
    name: str
    users: int
    think_time_mean_s: float
    system_prompt_tokens: int
    context_chunks: int
    chunk_tokens: int
    corpus_chunks: int
    question_tokens: Range
    answer_tokens: Range
    document_share: float
    document_tokens: Range
    warmup_s: float
    duration_s: float
    targets: dict
    engine: dict = field(default_factory=dict)

    @property
    def context_tokens(self) -> int:
        return self.context_chunks * self.chunk_tokens

    def mean_prompt_tokens(self) -> float:
        rag = self.context_tokens
        doc = self.document_tokens.mean
        own = (1 - self.document_share) * rag + self.document_share * doc + self.question_tokens.mean
        return self.system_prompt_tokens + own


def load_workload(path: Path = WORKLOAD_FILE) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def load_profile(name: str, path: Path = WORKLOAD_FILE) -> CaseProfile:
    """Raises `KeyError` naming the known profiles when `name` is not one of them."""
    profiles = load_workload(path)["profiles"]
    if name not in profiles:
        raise KeyError(f"unknown profile {name!r}; known: {sorted(profiles)}")
    raw = profiles[name]
    think = raw["think_time_s"]
    if think.get("dist") != "exponential":
        raise ValueError(f"profile {name}: think_time_s must be exponential, got {think}")
    ctx = raw["context"]
    return CaseProfile(
        name=name, users=int(raw["users"]), think_time_mean_s=float(think["mean"]),
        system_prompt_tokens=int(raw["system_prompt_tokens"]), context_chunks=int(ctx["chunks"]),
        chunk_tokens=int(ctx["chunk_tokens"]), corpus_chunks=int(ctx["corpus_chunks"]),
        question_tokens=Range(**raw["question_tokens"]), answer_tokens=Range(**raw["answer_tokens"]),
        document_share=float(raw["document_share"]), document_tokens=Range(**raw["document_tokens"]),
        warmup_s=float(raw["warmup_s"]), duration_s=float(raw["duration_s"]), targets=dict(raw["targets"]),
        engine=dict(raw.get("engine") or {}))


def load_variant(name: str, profile: str, path: Path = WORKLOAD_FILE) -> dict:
    """`{"config": Path, "context_first": bool, "replicas": int}` for `first_attempt` or `the_fix` on
    `profile` (`replicas`: engine servers, one per GPU; 1 unless the variant says otherwise)."""
    variants = load_workload(path)["variants"]
    if name not in variants:
        raise KeyError(f"unknown variant {name!r}; known: {sorted(variants)}")
    v = variants[name]
    if profile not in v["config"]:
        raise KeyError(f"variant {name!r} has no config for profile {profile!r}")
    return {"config": CASE_DIR / v["config"][profile], "context_first": bool(v["context_first"]),
            "replicas": int(v.get("replicas", {}).get(profile, 1))}


@dataclass
class CaseRequest:
    kind: str  # "rag" or "document"
    prompt: list[int]
    max_tokens: int
    system_offset: int  # index of the system prompt's first token in `prompt`
    system_tokens: int


class RequestSampler:
    """Draws requests; the system prompt and the chunk corpus are fixed by `seed`, so both variants and
    every run see the same texts."""

    def __init__(self, profile: CaseProfile, vocab_size: int, order: tuple[str, ...], seed: int = 0) -> None:
        self.profile = profile
        self.vocab_size = vocab_size
        self.order = order
        fixed = np.random.default_rng([seed, 7])
        self.system = self._ids(fixed, profile.system_prompt_tokens)
        self.corpus = [self._ids(fixed, profile.chunk_tokens) for _ in range(profile.corpus_chunks)]

    def _ids(self, rng: np.random.Generator, n: int) -> list[int]:
        return rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=n).tolist()

    def sample(self, rng: np.random.Generator) -> CaseRequest:
        p = self.profile
        if rng.random() < p.document_share:
            kind, context = "document", self._ids(rng, p.document_tokens.sample(rng))
        else:
            picks = rng.choice(len(self.corpus), size=p.context_chunks, replace=False)
            kind, context = "rag", [t for i in picks for t in self.corpus[int(i)]]
        parts = {"system": self.system, "context": context, "question": self._ids(rng, p.question_tokens.sample(rng))}
        prompt, offset = [], 0
        for name in self.order:
            if name == "system":
                offset = len(prompt)
            prompt += parts[name]
        return CaseRequest(kind, prompt, p.answer_tokens.sample(rng), offset, len(self.system))

    def max_request_tokens(self) -> int:
        p = self.profile
        longest = max(p.context_tokens, p.document_tokens.max)
        return p.system_prompt_tokens + longest + p.question_tokens.max + p.answer_tokens.max
