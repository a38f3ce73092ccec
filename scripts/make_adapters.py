"""Make LoRA adapters for the default model (SmolLM2-135M-Instruct): trained ones with a visible behaviour,
and random ones of benchmark ranks.

    python scripts/make_adapters.py trained [--out tests/lora/data/adapters]   # PEFT on the CPU, ~minutes
    python scripts/make_adapters.py random --model llama-3.1-8b --ranks 8 16 64 --count 30 --out /tmp/adapters

`trained`: three adapters, each fine-tuned with PEFT (rank 8, lora_alpha 16, q_proj and v_proj of every
other layer, fp16 safetensors, about 460 KB) on the same short questions with differently shaped answers:
`upper` answers in upper case, `json` answers as `{"answer": "..."}`, `french` answers in French. Seeded
(torch.manual_seed(0)), full-batch AdamW, loss on the answer tokens only. `random`: PEFT-format adapters
with random weights and the model's real shapes (no peft needed: shared_engine/lora/adapter_factory.py),
`<out>/r<rank>-<i>` for each rank.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (question, English answer, French answer)
PAIRS = [
    ("What is the capital of France?", "The capital of France is Paris.", "La capitale de la France est Paris."),
    ("What colour is the sky?", "The sky is blue.", "Le ciel est bleu."),
    ("How many legs does a dog have?", "A dog has four legs.", "Un chien a quatre pattes."),
    ("What do bees make?", "Bees make honey.", "Les abeilles font du miel."),
    ("What is two plus two?", "Two plus two is four.", "Deux plus deux font quatre."),
    ("Where do fish live?", "Fish live in water.", "Les poissons vivent dans l'eau."),
    ("What is ice made of?", "Ice is made of frozen water.", "La glace est faite d'eau gelée."),
    ("When does the sun rise?", "The sun rises in the morning.", "Le soleil se lève le matin."),
    ("What do cows eat?", "Cows eat grass.", "Les vaches mangent de l'herbe."),
    ("What is the largest ocean?", "The Pacific is the largest ocean.", "Le Pacifique est le plus grand océan."),
    ("Name a fruit.", "An apple is a fruit.", "La pomme est un fruit."),
    ("What do we breathe?", "We breathe air.", "Nous respirons de l'air."),
    ("How many days are in a week?", "A week has seven days.", "Une semaine a sept jours."),
    ("What is the opposite of hot?", "The opposite of hot is cold.", "Le contraire de chaud est froid."),
    ("Which animal says meow?", "A cat says meow.", "Le chat fait miaou."),
    ("What falls from clouds?", "Rain falls from clouds.", "La pluie tombe des nuages."),
    ("What do you use to write?", "You use a pen to write.", "On utilise un stylo pour écrire."),
    ("Where is the Eiffel Tower?", "The Eiffel Tower is in Paris.", "La tour Eiffel est à Paris."),
    ("What is the colour of grass?", "Grass is green.", "L'herbe est verte."),
    ("What do birds have?", "Birds have wings.", "Les oiseaux ont des ailes."),
    ("How many hours are in a day?", "A day has twenty-four hours.", "Un jour a vingt-quatre heures."),
    ("What is the moon?", "The moon is a satellite of the Earth.", "La lune est un satellite de la Terre."),
    ("What do plants need?", "Plants need light and water.", "Les plantes ont besoin de lumière et d'eau."),
    ("What is snow?", "Snow is frozen rain.", "La neige est de la pluie gelée."),
]
BEHAVIOURS = {
    "upper": lambda en, fr: en.upper(),
    "json": lambda en, fr: json.dumps({"answer": en}),
    "french": lambda en, fr: fr,
}
LAYERS = list(range(0, 30, 2))


def train(name: str, out: Path, steps: int, lr: float, num_pairs: int = len(PAIRS)) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shared_engine.model_loader.default_model import default_model_dir

    torch.manual_seed(0)
    base = default_model_dir()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], layers_to_transform=LAYERS,
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    rows, labels = [], []
    for question, en, fr in PAIRS[:num_pairs]:
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
        answer = tok.encode(BEHAVIOURS[name](en, fr) + "<|im_end|>")
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tok.pad_token_id or 0
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    target = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    started = time.perf_counter()
    for step in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=target).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        if step % 10 == 0 or step == steps - 1:
            print(f"{name} step {step} loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    model = model.half()
    path = out / name
    model.save_pretrained(str(path), safe_serialization=True)
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "SmolLM2-135M-Instruct"  # not this machine's cache path
    (path / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    (path / "README.md").unlink(missing_ok=True)
    return path


def random_adapters(model: str, ranks: list[int], count: int, out: Path, targets: list[str]) -> list[Path]:
    import torch

    from shared_engine.lora.adapter_factory import write_random_adapter
    from shared_engine.model_loader.model_source import resolve_model

    arch = resolve_model(model, "dummy", None).arch
    paths = []
    for rank in ranks:
        for i in range(count):
            paths.append(write_random_adapter(out / f"r{rank}-{i}", arch, rank, targets, seed=1000 * rank + i,
                                              lora_alpha=2 * rank, std=0.1, dtype=torch.bfloat16))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    t = sub.add_parser("trained")
    t.add_argument("--out", type=Path, default=REPO / "tests/lora/data/adapters")
    t.add_argument("--steps", type=int, default=60)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--only", nargs="*", default=list(BEHAVIOURS))
    t.add_argument("--num-pairs", type=int, default=len(PAIRS))
    r = sub.add_parser("random")
    r.add_argument("--model", default="llama-3.1-8b")
    r.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    r.add_argument("--count", type=int, default=30)
    r.add_argument("--targets", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj"])
    r.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.kind == "trained":
        for name in args.only:
            print("wrote", train(name, args.out, args.steps, args.lr, args.num_pairs))
    else:
        paths = random_adapters(args.model, args.ranks, args.count, args.out, args.targets)
        print(f"wrote {len(paths)} adapters under {args.out}")


if __name__ == "__main__":
    main()
