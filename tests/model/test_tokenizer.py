"""The shipped tokenizer, checkpoint tokenizer files, and loading a GLM-5-layout tokenizer.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from model.chat import render
from model.special_tokens import SHIPPED_EOS_IDS, SHIPPED_PAD_ID, SHIPPED_VOCAB_SIZE, shipped_special_tokens
from model.tokenizer import Tokenizer, save_tokenizer_files
from tests.model.chat_corpus import CORPUS, NAMES
from tests.model.glm5_layout import write_glm5_layout_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "def f(x):\n    return x ** 2  # square\n",
    "Grüße, 北京欢迎你 🎉 — naïve café",
    "   leading and trailing   \n\n\t",
    "",
    "<|user|>mixed<think>special</think>and text<|endoftext|>",
]


def test_shipped_tokenizer_matches_the_presets():
    tok = Tokenizer.shipped()
    assert tok.vocab_size == SHIPPED_VOCAB_SIZE == 8192
    for content, tid in shipped_special_tokens():
        assert tok.token_to_id(content) == tid and tok.id_to_token(tid) == content
        assert tok.encode(content) == [tid]
    assert tok.eos_token_ids == SHIPPED_EOS_IDS and tok.pad_token_id == SHIPPED_PAD_ID
    assert max(tok.encode("".join(TEXTS))) < 8192


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(text):
    tok = Tokenizer.shipped()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    plain = tok.decode(ids, skip_special_tokens=True)
    assert "<|user|>" not in plain and "<think>" not in plain


def test_bpe_compresses_code():
    tok = Tokenizer.shipped()
    text = "import os\nfrom pathlib import Path\n\n\ndef main() -> None:\n    print(Path.cwd())\n"
    assert len(tok.encode(text)) < len(text.encode()) / 2.5


def test_save_tokenizer_files_loads_in_glm5_and_transformers(tmp_path):
    save_tokenizer_files(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["chat_template.jinja", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_token_ids == SHIPPED_EOS_IDS and tok.pad_token_id == SHIPPED_PAD_ID
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == SHIPPED_EOS_IDS

    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf.eos_token == "<|endoftext|>" and hf.pad_token_id == SHIPPED_PAD_ID and len(hf) == 8192
    _, msgs, tools = CORPUS[NAMES.index("tool_call_json_string_args")]
    from model.chat import normalize_messages

    text = render(msgs, tools)
    assert (
        hf.apply_chat_template(normalize_messages(msgs), tools=tools, tokenize=False, add_generation_prompt=True)
        == text
    )
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text)


def test_generation_config_keeps_other_keys(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 1.0, "eos_token_id": 1}))
    save_tokenizer_files(tmp_path)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["temperature"] == 1.0 and gen["eos_token_id"] == SHIPPED_EOS_IDS


def test_glm5_layout_tokenizer_loads_through_the_same_code(tmp_path):
    tok = Tokenizer.from_dir(write_glm5_layout_tokenizer(tmp_path))
    assert tok.special_id("[gMASK]") == 154822 and tok.special_id("<sop>") == 154824
    assert tok.special_id("<|observation|>") == 154829 and tok.special_id("<tool_response>") == 154845
    assert tok.eos_token_ids == [154820, 154827, 154829]
    assert tok.encode("[gMASK]<sop><|user|>hi")[:3] == [154822, 154824, 154827]
    save_tokenizer_files(tmp_path / "copy", tok)
    assert Tokenizer.from_dir(tmp_path / "copy").eos_token_ids == [154820, 154827, 154829]


def test_from_dir_honours_generation_config(tmp_path):
    save_tokenizer_files(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 8128, "pad_token_id": 8135}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_token_ids == [8128] and tok.pad_token_id == 8135


def test_missing_file_and_missing_specials_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        Tokenizer.from_dir(tmp_path)
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    Backend(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"lacks GLM-5 special tokens: <\|endoftext\|>"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="no token '<nope>'"):
        Tokenizer.shipped().special_id("<nope>")


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the corpus is CPython 3.11's standard library")
def test_training_script_reproduces_the_shipped_file():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_tokenizer.py"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
