"""The prompt renderer a server uses: GLM-5's built-in one, or the checkpoint's own chat template.

`model/chat.py` renders GLM-5's format byte for byte as the shipped `chat_template.jinja` does (training's loss
masks need its per-message segments). A checkpoint whose template is something else -- a later GLM-5 revision,
a user's fine-tune with its own system prompt -- must be served with that template, as transformers, sglang and
vLLM would: `load_renderer(model_dir)` returns a `JinjaTemplate` for it, rendered with jinja2 in a sandbox the
way transformers' `apply_chat_template` does (trim_blocks, lstrip_blocks, loop controls, `tojson`,
`raise_exception`, `strftime_now`), or None when the checkpoint's template is the shipped one (or absent).

A template that does not compile, or fails on a plain tool-using conversation, is refused at startup with
`TemplateUnusable`, naming the file and the problem -- never served by falling back to another format. The
model's output is parsed as GLM-5's either way (model/chat_parse.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from model.chat import REASONING_FIELDS, normalize_messages, render
from model.tokenizer import CHAT_TEMPLATE


class TemplateUnusable(ValueError):
    pass


class TemplateRenderError(ValueError):
    """The template refused a conversation (its `raise_exception`, or a rendering error)."""


def _raise(message: str):
    raise TemplateRenderError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class JinjaTemplate:
    """A chat template's source, compiled once; `render` has the signature of `model.chat.render`."""

    def __init__(self, source: str, origin: str, special_tokens: Mapping[str, str] | None = None):
        self.source, self.origin = source, origin
        self.special_tokens = dict(special_tokens or {})
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise TemplateUnusable(f"{origin} does not compile: {e}") from None

    def render(
        self, messages: Sequence[Any], tools: Sequence[Mapping] | None = None, add_generation_prompt: bool = True,
        enable_thinking: bool = True, clear_thinking: bool = True,
    ) -> str:  # fmt: skip
        """The prompt text through this template, from the arguments `model.chat.render` takes."""
        try:
            return self.template.render(
                messages=[_alias_reasoning(m) for m in normalize_messages(messages)],
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking,
                clear_thinking=clear_thinking,
                **self.special_tokens,
            )
        except TemplateRenderError:
            raise
        except (TemplateError, TypeError, AttributeError) as e:  # a template bug, or input it cannot take
            raise TemplateRenderError(f"the chat template ({self.origin}) failed: {type(e).__name__}: {e}") from None


def _alias_reasoning(m: dict) -> dict:
    """`thinking` / `reasoning` as `reasoning_content`, as transformers' apply_chat_template passes them."""
    if m.get("role") == "assistant" and m.get("reasoning_content") is None:
        for key in REASONING_FIELDS[1:]:
            if m.get(key) is not None:
                return {**m, "reasoning_content": m[key]}
    return m


PROBE = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should look.",
        "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}],
    },
    {"role": "tool", "tool_call_id": "c0", "content": "a.py"},
]
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "ls", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
    }
]


def read_template(model_dir: Path) -> tuple[str, str] | None:
    """(source, where it came from): chat_template.jinja, else tokenizer_config.json's `chat_template`."""
    f = model_dir / "chat_template.jinja"
    if f.is_file():
        return f.read_text(encoding="utf-8"), str(f)
    cfg = model_dir / "tokenizer_config.json"
    if cfg.is_file():
        tpl = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(tpl, list):  # named templates: transformers' choice is "default"
            tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
        if isinstance(tpl, str):
            return tpl, f"{cfg} (chat_template)"
    return None


def _special_tokens(model_dir: Path) -> dict[str, str]:
    cfg = model_dir / "tokenizer_config.json"
    if not cfg.is_file():
        return {}
    data = json.loads(cfg.read_text(encoding="utf-8"))
    out = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = data.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[key] = v
    return out


def load_renderer(model_dir: Path) -> JinjaTemplate | None:
    """The checkpoint's own template when it is not GLM-5's shipped one; None to use model/chat.py.

    Raises TemplateUnusable when the template does not compile or cannot render a plain tool-using turn."""
    found = read_template(Path(model_dir))
    if found is None:
        return None
    source, origin = found
    if source.strip() == CHAT_TEMPLATE.read_text(encoding="utf-8").strip():
        return None
    tpl = JinjaTemplate(source, origin, _special_tokens(Path(model_dir)))
    try:
        tpl.render(PROBE, PROBE_TOOLS, add_generation_prompt=True)
    except TemplateRenderError as e:
        raise TemplateUnusable(f"{origin} cannot render a tool-using conversation: {e}") from None
    return tpl


def builtin_render(messages, tools=None, add_generation_prompt=True, enable_thinking=True, clear_thinking=True):
    """model/chat.py's renderer (GLM-5's shipped template), under the name the server calls."""
    return render(messages, tools, add_generation_prompt, enable_thinking, clear_thinking)
