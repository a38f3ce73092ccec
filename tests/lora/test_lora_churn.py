"""H17: with 2 GPU slots, long greedy decodes on A1 and A2 keep their adapters while A3 and A4 are requested
again and again (and A3 reloaded under its name): A1 and A2 equal their solo runs, the A3/A4 requests wait
for a free slot instead of taking one, and every request finishes (tiny dummy-weight model, fp32)."""

from __future__ import annotations

import pytest

from shared_engine import LLM, LoRARequest, SamplingParams
from shared_engine.lora.adapter_factory import write_random_adapter
from shared_engine.model_arch import ModelArch

GREEDY = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
PROMPT = [5, 9, 17, 33, 65, 12, 7]


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    arch = ModelArch.from_dir(tiny_model_dir)
    root = tmp_path_factory.mktemp("churn")
    loras = [LoRARequest(f"A{i}", i, str(write_random_adapter(root / f"a{i}", arch, 4, seed=i, std=2.0)))
             for i in range(1, 5)]
    llm = LLM(str(tiny_model_dir), load_format="dummy", num_gpu_blocks_override=128, block_size=8, max_model_len=256,
              enable_lora=True, max_loras=2, max_cpu_loras=2, max_lora_rank=4)
    return llm, loras


def test_running_requests_keep_their_adapters_under_slot_churn(setup):
    llm, loras = setup
    solo = [llm.generate([PROMPT], GREEDY, use_tqdm=False, lora_request=lora)[0].outputs[0].token_ids
            for lora in loras[:2]]
    assert solo[0] != solo[1]
    engine = llm.engine
    manager = engine.runner.lora
    engine.add_request("a1", PROMPT, GREEDY, lora_request=loras[0])
    engine.add_request("a2", PROMPT, GREEDY, lora_request=loras[1])
    finished, step, extra = {}, 0, 0
    while engine.has_unfinished_requests():
        if step % 5 == 0 and step < 100:  # A3 / A4 (and a new version of A3) keep arriving
            lora = [loras[2], loras[3], LoRARequest("A3", 100 + step, loras[2].lora_path)][extra % 3]
            engine.add_request(f"x{extra}", PROMPT, SamplingParams(temperature=0.0, max_tokens=8), lora_request=lora)
            extra += 1
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0].token_ids
        running = {r.request_id: r for r in engine.scheduler.running}
        if "a1" in running and "a2" in running:
            assert {loras[0].cache_key, loras[1].cache_key} <= set(manager.slot_keys)
            assert all(r.lora_request in loras[:2] for r in running.values())  # nobody else got a slot
        engine.block_manager.check_integrity()
        step += 1
    assert finished["a1"] == solo[0] and finished["a2"] == solo[1]
    assert len(finished) == 2 + extra  # the waiting A3/A4 requests all ran once a slot freed
    assert not manager._users and manager.num_slot_loads >= 4
