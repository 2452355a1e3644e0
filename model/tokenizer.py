"""The tokenizer: a Hugging Face `tokenizer.json` (byte-level BPE) loaded with `tokenizers`, plus GLM-5's ids.

Two sources give the same object: a checkpoint directory (a real GLM-5 `tokenizer.json`, specials from 154820 on)
or the small tokenizer glm5 ships in `model/assets/` (8192 ids, specials at 8128..8191; trained by
`scripts/train_tokenizer.py`). Special ids are always looked up by name in the loaded file, never assumed.

`save_tokenizer_files` writes what a new checkpoint needs so that both glm5 and transformers' `AutoTokenizer`
load it: `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` and `generation_config.json`.
Knows nothing of chat structure (see `model/chat.py`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer as Backend

from model.special_tokens import EOS_TOKENS, GLM5_SPECIAL_OFFSETS, PAD_TOKEN

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_TOKENIZER = ASSETS / "tokenizer.json"
CHAT_TEMPLATE = ASSETS / "chat_template.jinja"


class Tokenizer:
    """A loaded `tokenizer.json` with GLM-5's special tokens resolved by name.

    `encode` recognises special tokens written in the text (`"<|user|>"` becomes one id), as GLM-5's servers do
    when they tokenize a rendered prompt; it adds nothing of its own (the chat template writes `[gMASK]<sop>`).
    """

    def __init__(self, backend, eos_token_ids: list[int] | None = None, pad_token_id: int | None = None):
        self._tok = backend
        missing = [t for t in GLM5_SPECIAL_OFFSETS if t != "[MASK]" and backend.token_to_id(t) is None]
        if missing:
            raise ValueError(f"tokenizer lacks GLM-5 special tokens: {', '.join(missing)}")
        self.eos_token_ids: list[int] = eos_token_ids or [self.special_id(t) for t in EOS_TOKENS]
        self.pad_token_id: int = self.special_id(PAD_TOKEN) if pad_token_id is None else pad_token_id
        self._special_ids = frozenset(
            tid for tid, tok in backend.get_added_tokens_decoder().items() if tok.special
        ) | frozenset(self.special_id(t) for t in GLM5_SPECIAL_OFFSETS if backend.token_to_id(t) is not None)

    @classmethod
    def from_file(cls, path: Path | str) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer file at {path}")
        return cls(Backend.from_file(str(path)))

    @classmethod
    def from_dir(cls, path: Path | str) -> Tokenizer:
        """Load `<dir>/tokenizer.json`; eos/pad ids come from `generation_config.json` when it names them."""
        path = Path(path)
        tok = cls.from_file(path / "tokenizer.json")
        gen = path / "generation_config.json"
        if gen.is_file():
            cfg = json.loads(gen.read_text(encoding="utf-8"))
            eos = cfg.get("eos_token_id")
            if eos is not None:
                tok.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
            if cfg.get("pad_token_id") is not None:
                tok.pad_token_id = int(cfg["pad_token_id"])
        return tok

    @classmethod
    def shipped(cls) -> Tokenizer:
        """glm5's own small tokenizer (the `tiny` / `small` presets use it)."""
        return _shipped()

    # ---- ids ----
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def special_id(self, token: str) -> int:
        """Id of a named special token; a clear error when this tokenizer has no such token."""
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"tokenizer has no token {token!r}")
        return tid

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    # ---- text ----
    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def to_str(self) -> str:
        """The `tokenizer.json` text."""
        return self._tok.to_str(pretty=True)


@lru_cache(maxsize=1)
def _shipped() -> Tokenizer:
    return Tokenizer.from_file(SHIPPED_TOKENIZER)


def tokenizer_config(tokenizer: Tokenizer) -> dict:
    """`tokenizer_config.json` in the form transformers' `AutoTokenizer` loads (the chat template is the
    separate `chat_template.jinja` file, which transformers picks up from the same directory)."""
    added = {}
    for tid in sorted(tokenizer.special_ids):
        added[str(tid)] = {
            "content": tokenizer.id_to_token(tid),
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "eos_token": tokenizer.id_to_token(tokenizer.eos_token_ids[0]),
        "pad_token": tokenizer.id_to_token(tokenizer.pad_token_id),
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "model_max_length": 202752,
        "padding_side": "left",
        "remove_space": False,
    }


def generation_config(tokenizer: Tokenizer) -> dict:
    """The token part of `generation_config.json`: GLM-5 stops on `<|endoftext|>`, `<|user|>`, `<|observation|>`."""
    return {"eos_token_id": list(tokenizer.eos_token_ids), "pad_token_id": tokenizer.pad_token_id}


def save_tokenizer_files(out_dir: Path, tokenizer: Tokenizer | None = None) -> None:
    """Write tokenizer.json, tokenizer_config.json, chat_template.jinja and generation_config.json into `out_dir`.

    `tokenizer` defaults to the shipped one. An existing `generation_config.json` keeps its other keys
    (sampling defaults); only the eos/pad ids are set.
    """
    tok = tokenizer or Tokenizer.shipped()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(tok.to_str() + "\n", encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE.read_text(encoding="utf-8"), encoding="utf-8")
    gen_path = out_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text(encoding="utf-8")) if gen_path.is_file() else {}
    gen.update(generation_config(tok))
    gen_path.write_text(json.dumps(gen, indent=2) + "\n")
