"""Multi-LoRA on CUDA (gpu-marked; the lead's H200 run): greedy generations that mix adapters and the base
model are the same through CUDA graphs (SGMV; BGMV too with LORA_GRAPH_BGMV=1) as eagerly through the masked
torch path, with mixed graph steps whose decodes are padded (the LoRA slot map must follow the graph's padded
rows); a step without adapter tokens replays the base-only graph and gives the base model's tokens; decode
steps whose adapters target only q/k/v/o replay the attention-only LoRA graphs. With
LORA_GRAPH_STREAM=1, also with 2 slots for the 3 adapters (loads between steps) on their own copy stream
(`lora_slot_stream`: a load must neither overwrite a slot under a step in flight nor be read before it lands)."""

from __future__ import annotations

import gc
import os
import random

import pytest
import torch

from shared_engine import LLM, LoRARequest, SamplingParams
from shared_engine.lora.adapter_factory import write_random_adapter
from shared_engine.model_arch import ModelArch

pytestmark = pytest.mark.gpu
ADAPTERS = [(4, ["q_proj", "v_proj"]), (8, ["q_proj", "k_proj", "v_proj", "o_proj"]),
            (16, ["o_proj", "gate_proj", "up_proj", "down_proj"])]


def test_lora_greedy_graphs_equal_eager_torch_path(small_model_dir, tmp_path):
    arch = ModelArch.from_dir(small_model_dir)
    loras = [LoRARequest(f"a{i}", i + 1, str(write_random_adapter(tmp_path / f"a{i}", arch, rank, targets, seed=i,
                                                                   lora_alpha=2 * rank, std=1.0)))
             for i, (rank, targets) in enumerate(ADAPTERS)]
    rng = random.Random(3)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 1024) for _ in range(rng.randrange(5, 200))]} for _ in range(12)]
    per_prompt = [None if i % 4 == 3 else loras[i % 4] for i in range(len(prompts))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    results, stats = {}, {}
    runs = [("eager_torch", dict(enforce_eager=True)), ("graphs_sgmv", {})]
    if os.environ.get("LORA_GRAPH_BGMV"):  # a third engine: BGMV in graphs too
        runs.append(("graphs_bgmv", dict(lora_kernel="bgmv")))
    if os.environ.get("LORA_GRAPH_STREAM"):  # slot churn, loads on a copy stream
        runs.append(("graphs_sgmv_stream_2_slots", dict(lora_slot_stream=True, max_loras=2)))
    for name, extra in runs:
        kwargs = dict(load_format="dummy", dtype="float32", max_model_len=512, max_num_seqs=8,
                      max_num_batched_tokens=64, device="cuda", enable_lora=True, max_loras=3, max_lora_rank=16)
        llm = LLM(str(small_model_dir), **{**kwargs, **extra})
        runner = llm.engine.runner
        if name == "eager_torch":
            runner.lora.ctx.kernel = "torch"  # the masked dense path (the CPU's), as the reference
        mixed = llm.generate(prompts, params, use_tqdm=False, lora_request=per_prompt)
        base_steps = runner.base_only_graph_steps
        base = llm.generate(prompts[:4], params, use_tqdm=False)  # no adapter in any step
        attention_steps = runner.attention_lora_graph_steps
        attention = llm.generate(prompts[:6], params, use_tqdm=False, lora_request=[loras[i % 2] for i in range(6)])
        results[name] = ([o.outputs[0].token_ids for o in mixed], [o.outputs[0].token_ids for o in base],
                         [o.outputs[0].token_ids for o in attention])
        stats[name] = (runner.graph_steps, runner.mixed_graph_steps, runner.base_only_graph_steps - base_steps,
                       runner.attention_lora_graph_steps - attention_steps)
        if runner.lora.streams is not None:
            assert runner.lora.streams.num_loads > len(loras)  # 3 adapters through 2 slots: reloads
        del llm, runner
        gc.collect()
        torch.cuda.empty_cache()
    assert stats["eager_torch"][0] == 0
    for name in list(results)[1:]:
        graph_steps, mixed_steps, base_only_steps, attention_steps = stats[name]
        assert mixed_steps > 0 and graph_steps > mixed_steps and base_only_steps > 0, (name, stats[name])
        assert attention_steps > 0, (name, stats[name])  # a0 (q/v) and a1 (q/k/v/o) only: attention graphs
        assert results[name] == results["eager_torch"], name
    adapter_out, base_out, _ = results["eager_torch"]
    assert adapter_out[0] != base_out[0] and adapter_out[1] != base_out[1]  # the adapters change the text
