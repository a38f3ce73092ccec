"""K8/K9: two different adapters never share weights or KV blocks because they were given one `lora_int_id`
(the offline API, where the caller picks ids and no content version is set): "x" loaded from A and then "x"
from B under the same id, or two names sharing an id in one batch, each give their own adapter's output on a
cold cache. Before, the CPU cache, the GPU slots and the prefix cache were keyed by `lora_int_id` alone for an
unversioned request: B was served A's cached weights and hit A's KV blocks (tiny dummy-weight model, fp32)."""

from __future__ import annotations

import pytest

from shared_engine import LLM, LoRARequest, SamplingParams
from shared_engine.lora.adapter_factory import write_random_adapter
from shared_engine.model_arch import ModelArch

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPT = [(i * 37 + 11) % 120 + 2 for i in range(40)]  # 5 full blocks of 8: a warm cache would be hit


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    arch = ModelArch.from_dir(tiny_model_dir)
    root = tmp_path_factory.mktemp("identity")
    paths = {name: str(write_random_adapter(root / name, arch, 4, seed=seed, std=2.0))
             for name, seed in [("A", 1), ("B", 2)]}
    llm = LLM(str(tiny_model_dir), load_format="dummy", num_gpu_blocks_override=128, block_size=8, max_model_len=256,
              enable_lora=True, max_loras=2, max_cpu_loras=4, max_lora_rank=4, enable_prefix_caching=True)
    return llm, paths


def run(llm, *loras):
    outs = llm.generate([PROMPT] * len(loras), GREEDY, use_tqdm=False, lora_request=list(loras))
    return [(o.outputs[0].token_ids, o.num_cached_tokens) for o in outs]


def cold(llm, lora):
    llm.engine.block_manager.reset_prefix_cache()
    return run(llm, lora)[0][0]


def test_one_id_two_paths_never_share_weights_or_kv(setup):
    llm, paths = setup
    ref_a = cold(llm, LoRARequest("ref-a", 101, paths["A"]))
    ref_b = cold(llm, LoRARequest("ref-b", 102, paths["B"]))
    assert ref_a != ref_b
    llm.engine.block_manager.reset_prefix_cache()
    (a, cached_a), = run(llm, LoRARequest("x", 7, paths["A"]))
    (again, cached_again), = run(llm, LoRARequest("x", 7, paths["A"]))
    assert a == again == ref_a and cached_a == 0 and cached_again >= 32  # the same adapter does share
    (b, cached_b), = run(llm, LoRARequest("x", 7, paths["B"]))  # "x" now from other weights, same id
    assert b == ref_b and cached_b == 0


def test_two_names_on_one_id_in_one_batch_keep_their_own_weights(setup):
    llm, paths = setup
    ref_a = cold(llm, LoRARequest("ref-a", 101, paths["A"]))
    ref_b = cold(llm, LoRARequest("ref-b", 102, paths["B"]))
    llm.engine.block_manager.reset_prefix_cache()
    (p, _), (q, _) = run(llm, LoRARequest("p", 9, paths["A"]), LoRARequest("q", 9, paths["B"]))
    assert p == ref_a and q == ref_b
    assert not llm.engine.runner.lora._users
    llm.engine.block_manager.check_integrity()


def test_the_server_keys_stay_id_and_version():
    """A registered adapter (version set) is keyed by id and content version, not by its path."""
    assert LoRARequest("x", 3, "/a", "abc").cache_key == LoRARequest("x", 3, "/b", "abc").cache_key
    assert LoRARequest("x", 3, "/a").cache_key != LoRARequest("x", 3, "/b").cache_key


def test_a_reload_from_rewritten_files_in_the_same_directory_is_a_new_adapter(setup, tmp_path):
    """The usual retrain workflow: new weights written over the adapter's directory, then loaded again under
    its name and path (the registry, as `POST /v1/load_lora_adapter` does). The new version gets the new
    weights and none of the old version's KV blocks; the old version, still cached, keeps its own."""
    import shutil

    from shared_engine.lora.lora_registry import LoRARegistry

    llm, paths = setup
    ref_a = cold(llm, LoRARequest("ref-a", 101, paths["A"]))
    ref_b = cold(llm, LoRARequest("ref-b", 102, paths["B"]))
    llm.engine.block_manager.reset_prefix_cache()
    shutil.copytree(paths["A"], tmp_path / "live")
    registry = LoRARegistry(llm.engine.source.arch, llm.engine.config.lora, "base")
    old = registry.register("live", str(tmp_path / "live"))
    assert run(llm, old) == [(ref_a, 0)]
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(f"{paths['B']}/{name}", tmp_path / "live" / name)
    new = registry.register("live", str(tmp_path / "live"))
    assert new.lora_path == old.lora_path
    assert run(llm, new) == [(ref_b, 0)]
    (a, cached), = run(llm, old)  # a request that started on the old version keeps the old weights
    assert a == ref_a and cached >= 32
