"""`OutputBuilder`: groups a request's `n` sequences and builds vLLM-shaped `RequestOutput`s, with
incremental detokenisation and stop strings."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared_engine.core.request import Request
from shared_engine.engine.detokenizer import IncrementalDetokenizer
from shared_engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from shared_engine.sampling.sampler import SampleResult


@dataclass
class _Group:
    request_id: str
    prompt: str | None
    children: list[Request]
    detokenizers: dict[str, IncrementalDetokenizer | None]
    logprobs: dict[str, list[dict[int, Logprob]]] = field(default_factory=dict)
    cumulative: dict[str, float] = field(default_factory=dict)
    # prompt position → {token id: Logprob} (the prompt token's and the top k), None at position 0
    prompt_logprobs: dict[int, dict[int, Logprob] | None] = field(default_factory=dict)
    num_seen: dict[str, int] = field(default_factory=dict)  # child id → output tokens already recorded
    final_only: bool = False  # build an output only when the whole group has finished


class OutputBuilder:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.groups: dict[str, _Group] = {}
        self._parent: dict[str, str] = {}

    def add_group(self, request_id: str, prompt: str | None, children: list[Request],
                  final_only: bool = False) -> None:
        detoks = {}
        for child in children:
            p = child.sampling_params
            detoks[child.request_id] = None if self.tokenizer is None else IncrementalDetokenizer(
                self.tokenizer, child.prompt_token_ids, p.stop, p.skip_special_tokens, p.include_stop_str_in_output)
            self._parent[child.request_id] = request_id
        self.groups[request_id] = _Group(request_id, prompt, children, detoks, final_only=final_only)

    def in_use(self, request_id: str) -> bool:
        """Whether `request_id` names a live request or one of a live request's sequences."""
        return request_id in self.groups or request_id in self._parent

    def children(self, request_id: str) -> list[Request]:
        group = self.groups.get(request_id)
        return group.children if group else []

    def drop(self, request_id: str) -> None:
        group = self.groups.pop(request_id, None)
        for child in group.children if group else []:
            self._parent.pop(child.request_id, None)

    def add_prompt_logprobs(self, child_id: str, begin: int, values: list[dict[int, Logprob] | None]) -> None:
        """Record prompt logprobs for positions begin, begin+1, ... (a recomputed chunk overwrites)."""
        parent = self._parent.get(child_id)
        if parent is None:
            return  # aborted while its step ran (async output processing)
        group = self.groups[parent]
        if group.children[0].request_id != child_id:
            return  # the n choices share one prompt
        for offset, value in enumerate(values):
            group.prompt_logprobs[begin + offset] = value

    def on_tokens(self, request: Request, samples: list[SampleResult]) -> tuple[str | None, int]:
        """Record a step's new tokens for the request (those the scheduler kept of `samples`: a speculative
        run is cut at EOS, a stop id or a length limit), one at a time. Returns the stop string one of them
        completed, if any (the request's later tokens are then dropped, so its text, token ids and logprobs
        all end at the stop), and how many tokens were recorded."""
        group = self.groups[self._parent[request.request_id]]
        rid = request.request_id
        seen = group.num_seen.get(rid, 0)
        detok = group.detokenizers[rid]
        min_tokens = request.sampling_params.min_tokens
        stop = None
        for i, sample in enumerate(samples[: request.num_output_tokens - seen]):
            if sample.logprob is not None:
                group.cumulative[rid] = group.cumulative.get(rid, 0.0) + sample.logprob
                entry = {tid: Logprob(lp, rank=r + 1) for r, (tid, lp) in enumerate(sample.top_logprobs or [])}
                entry.setdefault(sample.token_id, Logprob(sample.logprob, rank=sample.rank))
                group.logprobs.setdefault(rid, []).append(entry)
            if detok is not None:
                stop = detok.update([sample.token_id], check_stop=seen + i + 1 >= min_tokens)
                if stop is not None:
                    del request.output_token_ids[seen + i + 1:]
                    break
        group.num_seen[rid] = request.num_output_tokens
        if detok is not None and request.is_finished:
            detok.flush()
        return stop, request.num_output_tokens - seen

    def collect(self, updated: list[Request]) -> list[RequestOutput]:
        """One `RequestOutput` per group touched in this step; finished groups are then forgotten."""
        seen, outputs = set(), []
        for request in updated:
            parent = self._parent.get(request.request_id)
            if parent is None or parent in seen:
                continue
            seen.add(parent)
            group = self.groups[parent]
            if group.final_only and not all(c.is_finished for c in group.children):
                continue
            outputs.append(self.build(parent))
            if outputs[-1].finished:
                self.drop(parent)
        return outputs

    def build(self, request_id: str) -> RequestOutput:
        group = self.groups[request_id]
        completions = []
        for child in group.children:
            detok = group.detokenizers[child.request_id]
            if detok is not None and child.is_finished:
                detok.flush()
            completions.append(CompletionOutput(
                index=child.index,
                text=detok.text if detok is not None else "",
                token_ids=list(child.output_token_ids),
                cumulative_logprob=group.cumulative.get(child.request_id),
                logprobs=group.logprobs.get(child.request_id),
                finish_reason=child.status.value if child.is_finished else None,
                stop_reason=child.stop_reason,
                stream_safe_len=detok.stream_safe_len if detok is not None else None,
            ))
        first = group.children[0]
        def times(name: str) -> list[float]:
            return [getattr(c, name) for c in group.children if getattr(c, name) is not None]

        metrics = RequestMetrics(
            arrival_time=first.arrival_time,
            first_scheduled_time=min(times("first_scheduled_time"), default=None),
            first_token_time=min(times("first_token_time"), default=None),
            last_token_time=max(times("last_token_time"), default=None),
            finished_time=max(times("finished_time"), default=None),
        )
        return RequestOutput(
            request_id=request_id,
            prompt=group.prompt,
            prompt_token_ids=first.prompt_token_ids,
            outputs=completions,
            finished=all(c.is_finished for c in group.children),
            metrics=metrics,
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=self._prompt_logprobs(group, first.prompt_token_ids),
        )

    @staticmethod
    def _prompt_logprobs(group: _Group, prompt_ids: list[int]) -> list[dict[int, Logprob] | None] | None:
        if not group.prompt_logprobs:
            return None
        return [group.prompt_logprobs.get(i) for i in range(len(prompt_ids))]
