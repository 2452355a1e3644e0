"""Prompt files: JSONL of {"prompt": text} or {"messages": [...]} per line, rendered to token ids for generation
(align-mtp's prompts, RL's tasks). Knows nothing of training."""

from __future__ import annotations

import json
from pathlib import Path


def read_prompt_rows(path: Path, tokenizer) -> list[tuple[list[int], dict, str]]:
    """A JSONL file of prompts -> (token ids, the line's object, "FILE:LINE") per line. Each line:
    {"prompt": "raw text"} or {"messages": [...]} (OpenAI chat messages, rendered with GLM-5's chat template and
    its generation prompt; optional "tools", and "chat_template_kwargs": {"enable_thinking": false} as in a chat
    request, for a model served with thinking off). A bad line raises ValueError naming the file and line; other keys
    (an RL task's reward) are the caller's to read and to report by that location."""
    from model.chat import render

    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            except (ValueError, RecursionError) as e:  # nesting past the stack, a number past the digit limit
                raise ValueError(f"{where}: unreadable JSON ({type(e).__name__})") from None
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
