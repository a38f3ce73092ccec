"""Tensor parallelism on the other architectures' parts, with random weights saved as a Hugging Face
checkpoint (so TP=1 and TP=2 load the same weights): Qwen2 (q/k/v biases, sharded with their rows) and Qwen3
(per-head q/k RMSNorm), 6 query / 3 KV heads (split 2 + 1 KV heads at TP=2, uneven), an untied LM head and a
vocabulary of 129 (padded to 130 at TP=2, the padding logit dropped). Greedy tokens over a batch must match
TP=1 exactly, and logprobs to 1e-4 (fp32 CPU, gloo); with ngram speculative decoding at TP=2 too."""

from __future__ import annotations

import gc

import pytest

from shared_engine import LLM, SamplingParams

PROMPTS = [[5, 17, 33, 2, 90, 7], [100, 3], [8] * 20]


def _checkpoint(path, architecture: str):
    import torch
    import transformers

    config_cls = {"Qwen2ForCausalLM": transformers.Qwen2Config, "Qwen3ForCausalLM": transformers.Qwen3Config}
    config = config_cls[architecture](
        vocab_size=129, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=3, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
        rms_norm_eps=1e-6, architectures=[architecture])
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config)
    with torch.no_grad():  # larger than the default init, so greedy tokens depend on the weights
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return path


def _run(path, tp: int, **settings) -> list:
    llm = LLM(str(path), tensor_parallel_size=tp, device="cpu", dtype="float32", max_model_len=64,
              num_gpu_blocks_override=32, max_num_batched_tokens=16, **settings)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2),
                            use_tqdm=False)
        if "speculative_config" in settings:  # drafts were proposed and verified on both ranks
            assert llm.engine.stats.spec.num_draft_tokens_total > 0
        return [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs])
                for o in outs]
    finally:
        runner = llm.engine.runner
        llm.shutdown()
        assert getattr(runner, "error", None) is None  # a shutdown's worker exits are not failures
        del llm, runner
        gc.collect()


@pytest.mark.parametrize("architecture", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_tp2_matches_tp1(tmp_path, architecture):
    path = _checkpoint(tmp_path / architecture, architecture)
    ref, got = _run(path, 1), _run(path, 2)
    assert len({t for ids, _ in ref for t in ids}) > 3  # not a degenerate repeat of one token
    for (ref_ids, ref_lps), (ids, lps) in zip(ref, got, strict=True):
        assert ids == ref_ids
        for mine, theirs in zip(lps, ref_lps, strict=True):
            assert mine.keys() == theirs.keys()
            assert all(mine[t] == pytest.approx(v, abs=1e-4) for t, v in theirs.items())


def test_tp2_with_speculative_decoding_matches_tp1(tmp_path):
    """ngram drafts (the repeated prompt proposes its own tokens), verified as k+1-token steps on both ranks
    and accepted by rank 0's rejection sampler: the greedy tokens of TP=1 without speculation."""
    path = _checkpoint(tmp_path / "qwen3", "Qwen3ForCausalLM")
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "policy": "always"}
    ref, got = _run(path, 1), _run(path, 2, speculative_config=ngram)
    assert [ids for ids, _ in got] == [ids for ids, _ in ref]
