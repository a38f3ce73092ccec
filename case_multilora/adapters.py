"""The case's trained tenant adapters: small PEFT LoRA fine-tunes of the default model (SmolLM2-135M-Instruct),
each with a behaviour a test can see in one greedy answer, at the brief's ranks (8, 16, 64).

    python -m case_multilora.adapters [--out DIR] [--export case_multilora/lora]
                                     # trains the missing ones (seeded, CPU, minutes), copies them

| adapter | rank | behaviour                                  |
|---------|------|--------------------------------------------|
| upper   | 8    | answers in upper case                      |
| json    | 16   | answers as {"answer": "..."}               |
| french  | 64   | answers in French                          |
| acme    | 8    | answers start with the tenant keyword ACME: |

Training: torch.manual_seed(0), full-batch AdamW (lr 5e-3) over the first 12 question/answer pairs of
scripts/make_adapters.py for `upper` (30 steps), the first 6 for the others (14 steps: a shared 2-core
CPU took about a minute a step), loss on the answer tokens only, q_proj and v_proj
of the top layers only (so the backward pass stops there: a step costs about a forward pass plus the top third),
fp16 safetensors. The trained adapters are committed in `case_multilora/lora/<name>` (0.3-1.5 MB each; compose
and k8s mount that folder); a spec they were not trained from (the digest over its spec and training data in
their training.json) is trained into `$SHARED_ENGINE_CACHE/multilora_adapters/<name>-<digest>` instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMITTED = Path(__file__).resolve().parent / "lora"  # the trained adapters, committed (each file < 2 MiB)
sys.path.insert(0, str(REPO))

from scripts.make_adapters import PAIRS  # noqa: E402  (question, English answer, French answer)


@dataclass(frozen=True)
class AdapterSpec:
    """One trained adapter: `rank` r, lora_alpha 2r, on `layers` (q_proj, v_proj), `steps` full-batch steps."""

    name: str
    rank: int
    behaviour: str  # key of BEHAVIOURS
    layers: tuple[int, ...] = tuple(range(20, 30))
    steps: int = 30
    lr: float = 5e-3
    num_pairs: int = 12


BEHAVIOURS = {
    "upper": lambda en, fr: en.upper(),
    "json": lambda en, fr: json.dumps({"answer": en}),
    "french": lambda en, fr: fr,
    "acme": lambda en, fr: "ACME: " + en,
}
SPECS = (
    AdapterSpec("upper", 8, "upper"),
    AdapterSpec("json", 16, "json", steps=14, num_pairs=6),
    AdapterSpec("french", 64, "french", layers=tuple(range(24, 30)), steps=14, num_pairs=6),  # 1.4 MB, not 2.8
    AdapterSpec("acme", 8, "acme", steps=14, num_pairs=6),
)


def spec_digest(spec: AdapterSpec) -> str:
    """12 hex digits over the spec, its behaviour's answers and the training pairs: the cache key."""
    answers = [BEHAVIOURS[spec.behaviour](en, fr) for _, en, fr in PAIRS[:spec.num_pairs]]
    blob = json.dumps([asdict(spec), PAIRS[:spec.num_pairs], answers], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def default_dir() -> Path:
    cache = Path(os.environ.get("SHARED_ENGINE_CACHE") or Path.home() / ".cache" / "shared_engine")
    return cache / "multilora_adapters"


def train(spec: AdapterSpec, out: Path) -> Path:
    """Trains `spec` into `out/<name>` (adapter_config.json + adapter_model.safetensors); returns that path."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shared_engine.model_loader.default_model import default_model_dir

    torch.manual_seed(0)
    base = default_model_dir()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=spec.rank, lora_alpha=2 * spec.rank, target_modules=["q_proj", "v_proj"],
                        layers_to_transform=list(spec.layers), lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    rows, labels = [], []
    for question, en, fr in PAIRS[:spec.num_pairs]:
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
        answer = tok.encode(BEHAVIOURS[spec.behaviour](en, fr) + "<|im_end|>")
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tok.pad_token_id or 0
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])                    # [num_pairs, width]
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    target = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr)
    started = time.perf_counter()
    for step in range(spec.steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=target).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        if step % 5 == 0 or step == spec.steps - 1:
            print(f"{spec.name} step {step} loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    model = model.half()
    path = out / f"{spec.name}-{spec_digest(spec)}"
    model.save_pretrained(str(path), safe_serialization=True)
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "SmolLM2-135M-Instruct"  # not this machine's cache path
    (path / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    (path / "README.md").unlink(missing_ok=True)
    (path / "training.json").write_text(json.dumps({**asdict(spec), "digest": spec_digest(spec),
                                                    "final_loss": round(loss.item(), 4),
                                                    "train_s": round(time.perf_counter() - started, 1)}, indent=2))
    return path


def ensure_adapters(out: Path | None = None) -> dict[str, Path]:
    """{name: adapter directory} for every spec: the committed copy in case_multilora/lora/<name> when it was
    trained from this spec (its training.json digest), else `out` (default: the cache), training what is missing."""
    out = out or default_dir()
    paths = {}
    for spec in SPECS:
        committed = COMMITTED / spec.name
        meta = committed / "training.json"
        if meta.exists() and json.loads(meta.read_text()).get("digest") == spec_digest(spec):
            paths[spec.name] = committed
            continue
        path = out / f"{spec.name}-{spec_digest(spec)}"
        if not (path / "training.json").exists():
            out.mkdir(parents=True, exist_ok=True)
            train(spec, out)
        paths[spec.name] = path
    return paths


def export(paths: dict[str, Path], dest: Path) -> dict[str, Path]:
    """Copies each adapter to `dest/<name>` (the names the engine configs' `lora_modules` use); returns them."""
    out = {}
    for name, path in paths.items():
        target = dest / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(path, target)
        out[name] = target
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="default: $SHARED_ENGINE_CACHE/multilora_adapters")
    parser.add_argument("--export", type=Path, default=None,
                        help="also copy them to EXPORT/<name> (case_multilora/lora: the committed copies)")
    args = parser.parse_args()
    paths = ensure_adapters(args.out)
    if args.export:
        paths = export(paths, args.export)
    for name, path in paths.items():
        print(name, path)


if __name__ == "__main__":
    main()
