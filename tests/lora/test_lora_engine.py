"""The engine on LoRA adapters (offline API, default model, fp32 CPU): a batch mixing adapters and the base
equals PEFT's merged model token for token; adapters never share prefix-cache blocks with each other, with
the base, or with an older version of themselves; adapters are refused before they run."""

from __future__ import annotations

import pytest

from shared_engine import LLM, LoRARequest, SamplingParams
from tests.lora.conftest import ADAPTERS, peft_greedy

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]
# 80+ tokens: several full blocks, so a second request can hit the prefix cache
LONG = ("You are a helpful assistant for a small bookshop in Lyon. Customers ask about opening hours, "
        "orders, second-hand books, author readings and gift vouchers. Answer politely and briefly, and "
        "never invent prices. Question: do you buy old atlases?")


@pytest.fixture(scope="module")
def prompts(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    chat = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for q in [*QUESTIONS, LONG]]
    assert len(chat[-1]) >= 80
    return chat


@pytest.fixture(scope="module")
def references(default_model_dir, adapter_dirs, prompts):
    """adapter name (None: base) → greedy ids per prompt from PEFT's merged model."""
    names = [None, *ADAPTERS]
    return {n: peft_greedy(default_model_dir, None if n is None else adapter_dirs[n], prompts, MAX_TOKENS)
            for n in names}


@pytest.fixture(scope="module")
def llm():
    # 2 GPU slots for 3 adapters: the mixed batch also exercises the per-step limit and slot eviction
    return LLM(kv_cache_memory=64 * 2**20, max_model_len=512, enable_lora=True, max_loras=2, max_cpu_loras=3,
               max_lora_rank=16)


def lora(adapter_dirs, name: str, int_id: int | None = None) -> LoRARequest:
    return LoRARequest(name, int_id or list(ADAPTERS).index(name) + 1, str(adapter_dirs[name]))


def check_idle(llm) -> None:
    bm = llm.engine.block_manager
    bm.check_integrity()
    assert bm.num_free_blocks == bm.num_blocks
    assert not llm.engine.runner.lora._users  # every request released its adapter


def test_references_differ_per_adapter(references):
    """Each adapter changes the base model's output (else equality below would prove nothing)."""
    outputs = [tuple(map(tuple, v)) for v in references.values()]
    assert len(set(outputs)) == len(outputs)


def test_mixed_batch_equals_peft_merged(llm, adapter_dirs, prompts, references):
    names = [None, *ADAPTERS]
    batch = [(p, n) for p in range(len(prompts)) for n in names]
    loras = [None if n is None else lora(adapter_dirs, n) for _, n in batch]
    outs = llm.generate([prompts[p] for p, _ in batch], GREEDY, use_tqdm=False, lora_request=loras)
    for (p, n), out in zip(batch, outs):
        assert out.outputs[0].token_ids == references[n][p], (n, p)
    check_idle(llm)
    assert llm.engine.runner.lora.num_slot_loads >= 3  # three adapters through two slots


def test_steps_run_only_the_projection_groups_their_adapters_target(llm, adapter_dirs, prompts, references,
                                                                    monkeypatch):
    """qv8 targets q and v only: its steps add the fused qkv projection's LoRA and launch nothing for o,
    gate_up and down (no slot holds rows there); mlp4 (o, gate, down) runs those three and not qkv; both
    together run all four. Outputs still equal PEFT's merged model."""
    from shared_engine.model_executor.layers.lora import LORA_ALL, LORA_ATTENTION, LoRAContext

    calls = []
    runs = LoRAContext.runs
    monkeypatch.setattr(LoRAContext, "runs", lambda self, group: calls.append((group, runs(self, group))) or
                        runs(self, group))
    ctx = llm.engine.runner.lora.ctx
    for names, ran, variant in [(["qv8"], {"qkv"}, LORA_ATTENTION), (["mlp4"], {"o", "gate_up", "down"}, LORA_ALL),
                                (["qv8", "mlp4"], {"qkv", "o", "gate_up", "down"}, LORA_ALL)]:
        calls.clear()
        outs = llm.generate([prompts[0]] * len(names), GREEDY, use_tqdm=False,
                            lora_request=[lora(adapter_dirs, n) for n in names])
        assert [o.outputs[0].token_ids for o in outs] == [references[n][0] for n in names]
        assert {g for g, r in calls if r} == ran and {g for g, r in calls if not r} == {"qkv", "o", "gate_up",
                                                                                         "down"} - ran, names
        assert ctx.groups == ran and ctx.variant() == variant
    check_idle(llm)


def test_large_eager_steps_take_64_token_sgmv_tiles(llm, adapter_dirs, prompts, references, monkeypatch):
    """The model runner asks for 64-token SGMV tiles in eager steps of at least PREFILL_TILE_ROWS rows (the
    threshold lowered to the long prompt's length here) and 16-token ones otherwise (decodes, and CUDA
    graphs, captured with 16); the output is unchanged (the CPU's torch path reads no tiles)."""
    import shared_engine.model_executor.layers.lora as lora_layers
    from kernels.lora_sgmv import PREFILL_TILE_M, TILE_M

    assert lora_layers.step_tile_m(8192, graphed=False) == TILE_M  # off by default (slower on the H200)
    monkeypatch.setattr(lora_layers, "PREFILL_TILE_ROWS", 1024)
    assert lora_layers.step_tile_m(8192, graphed=True) == TILE_M and lora_layers.step_tile_m(1, False) == TILE_M
    assert lora_layers.step_tile_m(1024, False) == PREFILL_TILE_M
    monkeypatch.setattr(lora_layers, "PREFILL_TILE_ROWS", len(prompts[-1]))
    ctx = llm.engine.runner.lora.ctx
    seen = []
    original = ctx.set_token_slots
    monkeypatch.setattr(ctx, "set_token_slots", lambda slots, tile_m=None: seen.append((len(slots), tile_m)) or
                        original(slots, tile_m))
    out = llm.generate([prompts[-1]], GREEDY, use_tqdm=False, lora_request=lora(adapter_dirs, "all16", 61))  # cold
    assert out[0].outputs[0].token_ids == references["all16"][-1]
    assert seen[0] == (len(prompts[-1]), PREFILL_TILE_M) and all(t == TILE_M for n, t in seen[1:]), seen
    assert ctx.tile_m == TILE_M


def test_isolation_cached_tokens(llm, adapter_dirs, prompts, references):
    """The same long prompt on A, B, the base, then B again: each equals its own cold output; only B's
    second call hits the cache."""
    long = prompts[-1]
    a, b = lora(adapter_dirs, "qv8", 21), lora(adapter_dirs, "all16", 22)  # new ids: nothing cached yet
    cached = []
    for name, request in [("qv8", a), ("all16", b), (None, None), ("all16", b)]:
        out = llm.generate([long], GREEDY, use_tqdm=False, lora_request=request)[0]
        assert out.outputs[0].token_ids == references[name][-1], name
        cached.append(out.num_cached_tokens)
    assert cached[:2] == [0, 0]
    assert cached[3] >= len(long) // 16 * 16 - 16  # B's second call: every full block but the last
    check_idle(llm)


def test_reload_under_same_name_follows_new_weights(llm, adapter_dirs, prompts, references):
    long = prompts[-1]
    first = LoRARequest("x", 31, str(adapter_dirs["qv8"]))
    out = llm.generate([long], GREEDY, use_tqdm=False, lora_request=first)[0]
    assert out.outputs[0].token_ids == references["qv8"][-1]
    second = LoRARequest("x", 32, str(adapter_dirs["all16"]))  # "x" reloaded from other weights
    out = llm.generate([long], GREEDY, use_tqdm=False, lora_request=second)[0]
    assert out.outputs[0].token_ids == references["all16"][-1]
    assert out.num_cached_tokens == 0  # the old version's blocks are not the new one's
    check_idle(llm)


def test_generate_reads_each_adapter_from_disk_once(llm, adapter_dirs, prompts, references, monkeypatch):
    """The offline check before a batch reads a new adapter into the CPU cache (not once for the check and
    again for the requests) and does not read a cached one again: before, every `generate` re-read and
    re-validated each of its adapters from disk (bench_lora's timed runs: 30 adapters per call)."""
    import shared_engine.lora.lora_manager as lora_manager

    reads = []
    real = lora_manager.load_adapter
    monkeypatch.setattr(lora_manager, "load_adapter", lambda name, *a: reads.append(name) or real(name, *a))
    manager = llm.engine.runner.lora
    loras = [lora(adapter_dirs, "qv8", 51), lora(adapter_dirs, "mlp4", 52)]  # new ids: not cached yet
    for expected in (["mlp4", "qv8"], []):
        reads.clear()
        before = manager.num_disk_loads
        outs = llm.generate([prompts[0]] * 2, GREEDY, use_tqdm=False, lora_request=loras)
        assert sorted(reads) == expected  # one read each (set order)
        assert manager.num_disk_loads - before == len(expected)
        assert [o.outputs[0].token_ids for o in outs] == [references["qv8"][0], references["mlp4"][0]]
    check_idle(llm)


def test_bad_adapter_refused_before_anything_runs(llm, tmp_path, prompts, references):
    with pytest.raises(ValueError, match="no adapter_config.json|does not exist"):
        llm.generate([prompts[0]], GREEDY, use_tqdm=False, lora_request=LoRARequest("gone", 40, str(tmp_path)))
    out = llm.generate([prompts[0]], GREEDY, use_tqdm=False)[0]  # the engine keeps serving
    assert out.outputs[0].token_ids == references[None][0]
    check_idle(llm)


def test_lora_request_without_enable_lora_is_refused(default_model_dir, adapter_dirs, prompts):
    base = LLM(kv_cache_memory=16 * 2**20, max_model_len=256)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        base.generate([prompts[0]], GREEDY, use_tqdm=False, lora_request=lora(adapter_dirs, "qv8"))
