"""Prompt files: JSONL of {"prompt": text} or {"messages": [...]} per line, rendered to token ids for generation
(align-mtp's prompts, RL's tasks). Knows nothing of training."""

from __future__ import annotations

from pathlib import Path

from finetune.data.jsonl import jsonl_rows
from model.chat import render


def read_prompt_rows(path: Path, tokenizer) -> list[tuple[list[int], dict, str]]:
    """A JSONL file of prompts -> (token ids, the line's object, "FILE:LINE") per line. Each line:
    {"prompt": "raw text"} or {"messages": [...]} (OpenAI chat messages, rendered with GLM-5's chat template and
    its generation prompt; optional "tools", and "chat_template_kwargs": {"enable_thinking": false} as in a chat
    request, for a model served with thinking off). A bad line raises ValueError naming the file and line; other keys
    (an RL task's reward) are the caller's to read and to report by that location."""
    out = []
    for n, row, bad in jsonl_rows(path):
        where = f"{path}:{n}"
        if bad is not None:
            raise ValueError(f"{where}: {bad}")
        if isinstance(row, dict) and isinstance(row.get("prompt"), str) and row["prompt"]:
            text = row["prompt"]
        elif isinstance(row, dict) and isinstance(row.get("messages"), list) and row["messages"]:
            kwargs = row.get("chat_template_kwargs") or {}
            thinking = kwargs.get("enable_thinking", True) if isinstance(kwargs, dict) else None
            if not isinstance(thinking, bool):
                raise ValueError(f'{where}: "chat_template_kwargs" must be an object whose "enable_thinking" is '
                                 "true or false")  # fmt: skip
            try:
                text = render(row["messages"], row.get("tools"), add_generation_prompt=True,
                              enable_thinking=thinking)  # fmt: skip
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{where}: bad messages ({e})") from None
        else:
            raise ValueError(f'{where}: expected {{"prompt": "text"}} or {{"messages": [...]}}')
        out.append((tokenizer.encode(text), row, where))
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out
