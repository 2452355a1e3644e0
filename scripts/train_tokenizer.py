"""Train the small byte-level BPE tokenizer that glm5 ships in `model/assets/tokenizer.json`.

No GLM-5 tokenizer file can be downloaded where glm5 is built, so the `tiny` / `small` presets use this one.
It has GLM-5's shape: GPT-2-style byte-level BPE (ids 0..8127) followed by the 64 special-token slots of
`model/special_tokens.py` (ids 8128..8191, GLM-5's order and offsets), 8192 ids in all.

Corpus: the `.py` files of CPython 3.11's standard library (code, docstrings and comments: English text and
Python source, which is what a coding agent reads and writes), in sorted path order, without the `test`,
`idlelib`, `lib2to3`, `tkinter` and `turtledemo` trees. Every byte is representable whatever the corpus, so
the tokenizer is merely less compact on other text.

Deterministic: the same Python minor version gives the same file list, and training runs on one thread.

    python scripts/train_tokenizer.py            # writes model/assets/tokenizer.json
    python scripts/train_tokenizer.py --check    # retrains and fails if the committed file differs
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from model.special_tokens import SHIPPED_SPECIAL_BASE, SHIPPED_VOCAB_SIZE, shipped_special_tokens  # noqa: E402

OUT = ROOT / "model" / "assets" / "tokenizer.json"
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "site-packages", "__pycache__"}

# GPT-4-style split (as GLM's tokenizer uses): contractions, letter runs with one leading non-letter,
# numbers in groups of at most 3 digits, punctuation runs, newline runs, other whitespace.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        files += [Path(root) / n for n in sorted(names) if n.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix())


def corpus_texts(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def build():
    """A trained `tokenizers.Tokenizer` with the special tokens appended at their shipped ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SHIPPED_SPECIAL_BASE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_texts(corpus_files()), trainer=trainer)
    if tok.get_vocab_size() != SHIPPED_SPECIAL_BASE:
        raise SystemExit(f"BPE vocabulary has {tok.get_vocab_size()} ids, expected {SHIPPED_SPECIAL_BASE}")
    # add_special_tokens appends in order, so the list's order is the id order.
    specials = shipped_special_tokens()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, _ in specials])
    for content, want in specials:
        got = tok.token_to_id(content)
        if got != want:
            raise SystemExit(f"{content} landed at id {got}, expected {want}")
    if tok.get_vocab_size() != SHIPPED_VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} ids, expected {SHIPPED_VOCAB_SIZE}")
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed tokenizer.json differs")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    text = build().to_str(pretty=True) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print("tokenizer.json is up to date" if same else f"{args.out} differs from a fresh training run")
        raise SystemExit(0 if same else 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({SHIPPED_VOCAB_SIZE} ids)")


if __name__ == "__main__":
    main()
