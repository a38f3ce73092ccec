"""`check_same_tokenizer`: a draft model must speak the target's token ids, checked once at start-up.

A draft whose ids mean other strings is not wrong (verification keeps the output exact) but accepts nothing,
so a mismatch is refused with an error that names both models and what differs.
"""

from __future__ import annotations

_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def check_same_tokenizer(target, draft) -> None:
    """Compare two `ModelSource`s: the logits' vocabulary size always; with a tokenizer on both sides, the
    vocabularies (token -> id) and special token ids; otherwise the config's BOS and EOS ids.

    Raises:
        ValueError: naming both models and every difference found.
    """
    problems = []
    if target.arch.vocab_size != draft.arch.vocab_size:
        problems.append(f"vocab_size {target.arch.vocab_size} vs {draft.arch.vocab_size}")
    same_dir = target.tokenizer_path is not None and target.tokenizer_path == draft.tokenizer_path
    tokenizers = (None, None) if same_dir else (_tokenizer(target), _tokenizer(draft))
    if tokenizers[0] is not None and tokenizers[1] is not None:
        problems += _tokenizer_differences(*tokenizers)
    elif not same_dir:
        if target.arch.bos_token_id != draft.arch.bos_token_id:
            problems.append(f"bos_token_id {target.arch.bos_token_id} vs {draft.arch.bos_token_id}")
        if set(target.arch.eos_token_ids) != set(draft.arch.eos_token_ids):
            problems.append(f"eos_token_id {sorted(target.arch.eos_token_ids)} vs {sorted(draft.arch.eos_token_ids)}")
    if problems:
        raise ValueError(f"draft model {draft.name!r} does not share the tokenizer of target model {target.name!r} "
                         f"(target vs draft): {'; '.join(problems)}")


def _tokenizer(source):
    from shared_engine.engine.tokenizer import load_tokenizer

    return load_tokenizer(source.tokenizer_path)


def _tokenizer_differences(target, draft) -> list[str]:
    problems = []
    if len(target) != len(draft):
        problems.append(f"tokenizer size {len(target)} vs {len(draft)}")
    for name in _SPECIAL:
        a, b = getattr(target, name, None), getattr(draft, name, None)
        if a != b:
            problems.append(f"{name} {a} vs {b}")
    if not problems:
        vocab_a, vocab_b = target.get_vocab(), draft.get_vocab()
        if vocab_a != vocab_b:
            differ = sorted(t for t in vocab_a.keys() ^ vocab_b.keys() | {t for t in vocab_a.keys() & vocab_b.keys()
                                                                          if vocab_a[t] != vocab_b[t]})
            problems.append(f"{len(differ)} vocabulary entries differ, e.g. {differ[:3]}")
    return problems
