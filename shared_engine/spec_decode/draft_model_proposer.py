"""`DraftModelProposer`: vLLM's `draft_model` method: a smaller model with the target's tokenizer drafts k
tokens per request per step, autoregressively and batched over the requests (`DraftModelRunner`).

`speculative_config.model` is a model directory or a preset (dummy weights; `llama-3.2-1b` drafts for
`llama-3.1-8b`). Start-up refuses a draft whose tokenizer differs from the target's
(`check_same_tokenizer`) and tensor parallelism (the draft would need its own sharding). Torch is imported
only when one is built (the config's validation imports this module's registry).
"""

from __future__ import annotations

from shared_engine.spec_decode.proposer import Proposer
from shared_engine.spec_decode.registry import register_proposer


@register_proposer("draft_model")
class DraftModelProposer(Proposer):
    def __init__(self, config, engine_config=None, source=None, runner=None, **_context) -> None:
        """`engine_config`, the target's `source` (`ModelSource`) and `runner` (`ModelRunner`, which mirrors
        every step into the draft's cache) come from the engine.

        Raises:
            ValueError: no engine context, tensor_parallel_size > 1, a draft not found, or a tokenizer
                mismatch (naming both models).
        """
        from shared_engine.model_loader.model_source import resolve_model
        from shared_engine.spec_decode.draft_model_runner import DraftModelRunner
        from shared_engine.spec_decode.draft_tokenizer_check import check_same_tokenizer

        if engine_config is None or source is None or runner is None:
            raise ValueError("the draft_model method needs the engine (config, target model and model runner)")
        if engine_config.parallel.tensor_parallel_size > 1:
            raise ValueError("speculative method 'draft_model' is not supported with tensor_parallel_size > 1")
        draft = resolve_model(config.model, "dummy")  # a directory loads its weights; a preset is dummy
        check_same_tokenizer(source, draft)
        self.draft = DraftModelRunner(engine_config, draft, config.num_speculative_tokens)
        runner.draft_runner = self.draft
        self._block_manager = None

    @property
    def kv_bytes_per_block(self) -> int:
        return self.draft.kv_bytes_per_block

    @property
    def reserved_kv_bytes(self) -> int:
        return self.draft.scratch_bytes

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.draft.allocate_kv_cache(num_blocks)

    def bind(self, block_manager) -> None:
        self._block_manager = block_manager

    def propose(self, requests: list, caps: list[int]) -> list[list[int]]:
        if self._block_manager is None:
            raise RuntimeError("DraftModelProposer.bind(block_manager) must run before the first proposal")
        return self.draft.propose(requests, caps, self._block_manager.get_block_table)

    def release(self, request_id: str) -> None:
        self.draft.release(request_id)
