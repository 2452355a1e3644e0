"""Prompt files (finetune/data/prompts.py): a chat row may turn thinking off as a chat request does."""

from __future__ import annotations

import json

import pytest

from finetune.data.prompts import read_prompt_rows
from model.tokenizer import Tokenizer


def test_a_row_with_thinking_off_ends_in_the_closed_think_and_bad_switches_name_their_line(tmp_path):
    tok = Tokenizer.shipped()
    msgs = [{"role": "user", "content": "hi"}]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"messages": msgs}) + "\n"
                    + json.dumps({"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}}) + "\n")  # fmt: skip
    (on, _, _), (off, _, _) = read_prompt_rows(path, tok)
    assert tok.decode(on).endswith("<|assistant|><think>") and tok.decode(off).endswith("<|assistant|></think>")
    path.write_text(json.dumps({"messages": msgs}) + "\n"
                    + json.dumps({"messages": msgs, "chat_template_kwargs": {"enable_thinking": "no"}}) + "\n")  # fmt: skip
    with pytest.raises(ValueError, match=r"p\.jsonl:2: .*enable_thinking"):
        read_prompt_rows(path, tok)
