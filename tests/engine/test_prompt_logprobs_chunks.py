"""Prompt logprobs in bounded memory: chunked rows equal a whole-chunk full-vocabulary log-softmax, and
the engine never puts more than `PROMPT_LOGPROBS_CHUNK` rows through the LM head at once."""

from __future__ import annotations

import torch

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.model_executor.prompt_logprobs import PROMPT_LOGPROBS_CHUNK, prompt_token_logprobs
from shared_engine.sampling_params import SamplingParams


def test_chunks_equal_the_full_log_softmax():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(23, 8)
    targets = torch.randint(0, 50, (22,)).tolist()  # the last row predicts no prompt token
    rows_seen = []

    def compute_logits(h):
        rows_seen.append(h.shape[0])
        return head(h).float()

    got = prompt_token_logprobs(compute_logits, hidden, targets, chunk=5)
    full = torch.log_softmax(head(hidden[:22]).float(), dim=-1)
    want = full[torch.arange(22), torch.tensor(targets)]
    assert torch.allclose(torch.tensor(got), want, atol=1e-6)
    assert rows_seen == [5, 5, 5, 5, 2]


def test_engine_prompt_logprobs_stay_within_a_chunk(tiny_model_dir):
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64, max_num_batched_tokens=512))
    model = engine.runner.model
    compute_logits, rows_seen, lm_rows = model.compute_logits, [], []

    def spy(h):
        rows_seen.append(h.shape[0])
        out = compute_logits(h)
        lm_rows.append((h, out))
        return out

    model.compute_logits = spy
    prompt = [(7 * i) % 120 + 3 for i in range(300)]
    engine.add_request("r", prompt, SamplingParams(max_tokens=1, prompt_logprobs=0), final_only=True)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    logprobs = outputs[-1].prompt_logprobs
    assert len(logprobs) == 300 and logprobs[0] is None
    assert max(rows_seen) <= PROMPT_LOGPROBS_CHUNK < 299
    assert rows_seen == [128, 128, 43, 1]  # 299 prompt positions in chunks, then the sampled row
    # each value is the next prompt token's entry in its position's full-vocabulary log-softmax
    full = torch.log_softmax(torch.cat([out for _, out in lm_rows[:-1]]), dim=-1)  # [299, vocab]
    want = full[torch.arange(299), torch.tensor(prompt[1:])]
    assert [next(iter(e)) for e in logprobs[1:]] == prompt[1:]
    got = torch.tensor([next(iter(e.values())).logprob for e in logprobs[1:]])
    assert torch.allclose(got, want, atol=1e-5)


def test_the_memory_profile_runs_one_prompt_logprobs_chunk(tiny_model_dir, monkeypatch):
    """The profiling pass that sizes the KV cache (CUDA) also runs one chunk of prompt logprobs at the
    server's top-k, so that a request with `prompt_logprobs` cannot take memory the profile did not count.
    Run here on the CPU with the CUDA synchronisation stubbed out."""
    from shared_engine.model_executor import model_runner

    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64))
    runner = engine.runner
    seen = []
    real = model_runner.prompt_token_entries

    def spy(compute_logits, hidden, targets, k, *args, **kwargs):
        seen.append((hidden.shape[0], len(targets), k))
        return real(compute_logits, hidden, targets, k, *args, **kwargs)

    monkeypatch.setattr(model_runner, "prompt_token_entries", spy)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)
    for num_tokens in (300, 40):
        runner._profile_run(num_tokens)
    k = engine.config.model.max_logprobs
    assert seen == [(PROMPT_LOGPROBS_CHUNK, PROMPT_LOGPROBS_CHUNK, k), (40, 40, k)]
