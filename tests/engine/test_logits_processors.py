"""Logits processing (sampling/logits_processors.py): `min_tokens` and `logit_bias` against transformers'
`min_new_tokens` and `sequence_bias`, greedy, token for token; grammar masks on a block of positions
(speculative decoding's shape) against a matcher that consumed the same tokens."""

from __future__ import annotations

import json

import pytest
import torch

from shared_engine import LLM, SamplingParams
from shared_engine.core.request import Request
from shared_engine.sampling.logits_processors import LogitsProcessors
from shared_engine.sampling_params import StructuredOutputsParams

EOS = 2


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=512, kv_cache_memory=128 * 2**20)


@pytest.fixture(scope="module")
def hf_model(default_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


def chat_ids(llm, text: str) -> list[int]:
    return llm.get_tokenizer().apply_chat_template([{"role": "user", "content": text}],
                                                   add_generation_prompt=True, tokenize=True, return_dict=False)


def hf_greedy(hf_model, ids: list[int], **kwargs) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                do_sample=False, pad_token_id=EOS, **kwargs)
    return out[0, len(ids):].tolist()


def ours(llm, ids: list[int], **kwargs) -> list[int]:
    return list(llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, **kwargs),
                             use_tqdm=False)[0].outputs[0].token_ids)


def test_min_tokens_masks_eos_like_transformers(llm, hf_model):
    ids = chat_ids(llm, "Hi")
    free = ours(llm, ids, max_tokens=40)
    assert free[-1] == EOS and len(free) < 20  # the test needs an early EOS to mask
    got = ours(llm, ids, max_tokens=40, min_tokens=20)
    assert EOS not in got[:20] and len(got) >= 20
    assert got == hf_greedy(hf_model, ids, max_new_tokens=40, min_new_tokens=20, eos_token_id=[EOS])


def test_min_tokens_masks_stop_token_ids(llm, hf_model):
    ids = chat_ids(llm, "Hi")
    free = ours(llm, ids, max_tokens=40)
    stop = free[2]  # a token the model emits early
    got = ours(llm, ids, max_tokens=30, min_tokens=12, stop_token_ids=[stop])
    assert stop not in got[:12] and EOS not in got[:12]
    ref = hf_greedy(hf_model, ids, max_new_tokens=30, min_new_tokens=12, eos_token_id=[EOS, stop])
    assert got == ref


def test_logit_bias_like_transformers_sequence_bias(llm, hf_model):
    ids = chat_ids(llm, "Name a colour.")
    free = ours(llm, ids, max_tokens=12)
    bias = {free[0]: -100.0, free[1]: -5.0, 4300: 3.0}  # forbid the first choice, nudge others
    got = ours(llm, ids, max_tokens=12, logit_bias=bias)
    assert got[0] != free[0]
    ref = hf_greedy(hf_model, ids, max_new_tokens=12, eos_token_id=[EOS],
                    sequence_bias={(t,): b for t, b in bias.items()})
    assert got == ref


def test_logit_bias_out_of_range_is_rejected(llm):
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("Hi", SamplingParams(logit_bias={0: 101.0}), use_tqdm=False)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("Hi", SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate("Hi", SamplingParams(stop_token_ids=[10**6]), use_tqdm=False)


def _request(params: SamplingParams, output: list[int]) -> Request:
    r = Request("r", [1, 2, 3], params, max_tokens=64, eos_token_ids=frozenset({EOS}))
    r.output_token_ids = list(output)
    return r


def test_block_of_positions_min_tokens_and_bias():
    """Rows are positions of one request after 0, 1, 2 draft tokens: min_tokens 3 with 1 output token masks
    EOS at the first two positions only; the bias applies at every position."""
    request = _request(SamplingParams(min_tokens=3, logit_bias={5: 2.0}, max_tokens=64), [7])
    logits = torch.zeros(3, 16)
    out = LogitsProcessors().apply(logits, [request] * 3, [[], [8], [8, 9]])
    assert torch.equal(logits, torch.zeros(3, 16))  # not modified in place
    assert out[0, EOS] == out[1, EOS] == float("-inf") and out[2, EOS] == 0
    assert (out[:, 5] == 2.0).all()
    plain = _request(SamplingParams(max_tokens=64), [7])
    assert LogitsProcessors().apply(logits, [plain]) is logits  # nothing to do: no copy


def test_grammar_masks_on_a_block_equal_masks_after_consuming(llm):
    """Speculative shape: the mask at the position after draft tokens d equals the mask of a matcher that
    consumed them, and a draft the grammar refuses leaves its later positions unmasked (unreachable)."""
    engine = llm.engine
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(max_tokens=64, structured_outputs=StructuredOutputsParams(
        json={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
    prefix = tokenizer.encode('{"city": "Par', add_special_tokens=False)
    vocab = engine.source.arch.vocab_size
    request = _request(params, prefix[:1])
    processors = LogitsProcessors(engine.grammar)
    drafts = [prefix[1:i] for i in range(1, len(prefix) + 1)]
    block = processors.apply(torch.zeros(len(drafts), vocab), [request] * len(drafts), drafts)
    for row, draft in enumerate(drafts):
        reference = LogitsProcessors(engine.grammar)
        ref = reference.apply(torch.zeros(1, vocab), [_request(params, prefix[:1] + draft)])
        assert torch.equal(block[row], ref[0]), row
        assert (block[row] == 0).sum() < vocab  # the grammar restricts every position
    bad = tokenizer.encode("xyz", add_special_tokens=False)
    rows = processors.apply(torch.zeros(2, vocab), [request] * 2, [[], bad])
    assert torch.isinf(rows[0]).any() and not torch.isinf(rows[1]).any()


def test_async_scheduling_same_outputs_and_grammar_waits(llm):
    """Under async scheduling min_tokens counts the placeholder of the step in flight, and a grammar (which
    reads the output tokens' values) collects that step before launching the next: outputs are the
    synchronous engine's, token for token."""
    from tests.engine.test_async_scheduling import _record

    async_llm = LLM(max_model_len=512, kv_cache_memory=128 * 2**20, async_scheduling=True)
    schema = StructuredOutputsParams(json={"type": "object", "properties": {"colour": {"type": "string"}},
                                           "required": ["colour"]})
    ids = chat_ids(llm, "Name a colour as JSON.")
    cases = [dict(max_tokens=30, structured_outputs=schema), dict(max_tokens=30, min_tokens=20),
             dict(max_tokens=8, logit_bias={ids[-1]: 5.0})]
    log = _record(async_llm.engine)
    for kwargs in cases:
        assert ours(async_llm, ids, **kwargs) == ours(llm, ids, **kwargs), kwargs
    launches = [n for kind, n in log if kind == "launch"]
    grammar_steps = launches[: len(ours(llm, ids, **cases[0]))]  # the first request's steps
    for n in grammar_steps[1:]:
        assert log.index(("collect", n - 1)) < log.index(("launch", n))
    text = llm.get_tokenizer().decode(ours(llm, ids, **cases[0]), skip_special_tokens=True)
    assert set(json.loads(text)) == {"colour"}


def test_a_grammar_that_fails_to_compile_ends_the_request_not_the_engine(llm):
    """Validation at add_request refuses a bad schema; should compiling still fail inside a step, the matcher
    allows only EOS."""
    bad = StructuredOutputsParams(json="{not json")
    with pytest.raises(ValueError, match="invalid JSON schema"):
        llm.generate("Hi", SamplingParams(structured_outputs=bad), use_tqdm=False)
    matcher = llm.engine.grammar.matcher(bad)
    allowed = matcher.mask_after([])
    assert allowed.nonzero().flatten().tolist() == [EOS]



def test_min_tokens_with_a_grammar_is_refused():
    """A complete JSON value allows only EOS, which min_tokens would mask: the pair is a ValueError (a 400)."""
    with pytest.raises(ValueError, match="min_tokens cannot be combined"):
        SamplingParams(min_tokens=5, structured_outputs=StructuredOutputsParams(json_object=True))
