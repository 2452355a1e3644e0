"""A synthetic tokenizer.json with GLM-5's special-token layout (specials from id 154820), for tests.

It reuses the shipped BPE and pads the vocabulary with filler entries up to 154820, so the special tokens
land at the ids real GLM-5 gives them. Code that hard-codes the shipped ids fails on it.
"""

from __future__ import annotations

import json
from pathlib import Path

from model.special_tokens import GLM5_SPECIAL_BASE, GLM5_SPECIAL_OFFSETS
from model.tokenizer import SHIPPED_TOKENIZER


def write_glm5_layout_tokenizer(out_dir: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer

    d = json.loads(SHIPPED_TOKENIZER.read_text(encoding="utf-8"))
    d["added_tokens"] = []
    vocab = d["model"]["vocab"]
    for i in range(len(vocab), GLM5_SPECIAL_BASE):
        vocab[f"<filler_{i}>"] = i
    tok = Tokenizer.from_str(json.dumps(d))
    by_offset = {off: t for t, off in GLM5_SPECIAL_OFFSETS.items()}
    n = max(GLM5_SPECIAL_OFFSETS.values()) + 1
    tok.add_special_tokens(
        [AddedToken(by_offset.get(i, f"<|reserved_{i}|>"), special=True, normalized=False) for i in range(n)]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    return out_dir
