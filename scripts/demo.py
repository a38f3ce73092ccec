"""`make demo`: our engine answers a few chat prompts with the embedded default model (SmolLM2-135M-Instruct,
fp32 on the CPU), then prints output tokens/s and the KV capacity line."""

from __future__ import annotations

import logging
import time

from shared_engine import LLM, SamplingParams

QUESTIONS = [
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for writing clear Python code.",
    "Explain in two sentences what a GPU is used for.",
    "Write a haiku about autumn leaves.",
]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    llm = LLM(max_model_len=2048)
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=128)
    started = time.perf_counter()
    outputs = llm.chat(conversations, params)
    elapsed = time.perf_counter() - started
    generated = 0
    for question, output in zip(QUESTIONS, outputs):
        choice = output.outputs[0]
        generated += len(choice.token_ids)
        print(f"\n>>> {question}\n{choice.text.strip()}\n[{len(choice.token_ids)} tokens, finish: "
              f"{choice.finish_reason}, TTFT {output.metrics.ttft * 1000:.0f} ms]")
    engine = llm.engine
    print(f"\n{len(QUESTIONS)} requests batched together: {generated} output tokens in {elapsed:.1f} s = "
          f"{generated / elapsed:.1f} output tokens/s")
    from shared_engine.engine.kv_capacity import capacity_line

    print(capacity_line(engine.block_manager.num_blocks, engine.block_manager.block_size, engine.max_model_len))


if __name__ == "__main__":
    main()
