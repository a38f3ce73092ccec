"""Request ids: a client id never collides with the ids derived for `n` > 1 choices (`<index>_<id>`), and
an id in use is refused while its request runs."""

from __future__ import annotations

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), device="cpu", load_format="dummy",
                                            num_gpu_blocks_override=64))


def _params(n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, n=n)


def test_derived_child_ids_cannot_be_taken(engine):
    engine.add_request("x", [5, 6, 7], _params(n=2))  # children 0_x and 1_x
    for clash, n in (("x", 1), ("0_x", 1), ("1_x", 3)):
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request(clash, [5, 6, 7], _params(n))
    engine.add_request("y", [5, 6, 7], _params())
    with pytest.raises(ValueError, match="already in use"):  # the same id again, with other choices
        engine.add_request("y", [5, 6, 7], _params(n=2))
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("0_x", [5, 6, 7], _params())  # free once x finished
    while engine.has_unfinished_requests():
        engine.step()


def test_a_parent_cannot_take_a_running_childs_id(engine):
    engine.add_request("0_z", [5, 6, 7], _params())
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("z", [5, 6, 7], _params(n=2))  # its child 0_z is running
    engine.abort_request("0_z")
    engine.add_request("z", [5, 6, 7], _params(n=2))
    engine.abort_request("z")
    assert not engine.has_unfinished_requests()
