"""Parsing GLM-5 completions into OpenAI messages: reasoning, content and tool calls, whole or streamed.

What GLM-5 writes after the generation prompt (`<|assistant|><think>`, or `<|assistant|></think>` with thinking
off), as sglang's and vLLM's `glm45` reasoning and `glm47` tool-call parsers read it:

    reasoning</think>content<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>...

- `thinking=True` means the text starts inside the think block (the prompt opened it). A leading `<think>` is
  skipped. Reasoning ends at `</think>`, or at `<tool_call>` (a call may interrupt reasoning, as sglang allows).
  Unclosed reasoning (a truncated completion) is all reasoning.
- `thinking=False`: the text is content, unless it opens with `<think>` (then that block is reasoning).
- Argument values: a value whose declared schema type is `string` is kept raw; any other value that parses as
  JSON is JSON, else the raw string (whitespace kept: code edits depend on it). Keys and names are stripped.
- Content is all text outside tool calls (before, between, after), joined and stripped; empty is None.
- The turn ends at a role or end tag (`<|user|>`, `<|observation|>`, `<|endoftext|>`, ...): the rest is ignored.

Malformed output has a defined result and never raises:
- a call with an empty name, or (when `tools` is given) an undeclared name, is kept as raw content text;
- an unclosed call (truncation) is closed where the text ends: complete arguments kept, a half-read value kept
  as read, a half-read key dropped;
- text between `</arg_key>` and `<arg_value>`, or between arguments, is ignored;
- a tag where it makes no sense (e.g. `<think>` inside content) is kept as literal text.

One state machine serves both: `StreamParser` feeds it text deltas (holding back a tail that may be the start of
a tag) and returns OpenAI-style deltas; `parse(text)` is one feed plus finish, accumulated. A string-typed
argument streams as it is written; other values are sent when they are complete (their type is not known
before). Argument fragments concatenate to `json.dumps(arguments, ensure_ascii=False)`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FORMAT_TAGS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
# Tags that end the assistant turn (the eos tokens, and role tags a broken model might emit).
STOP_TAGS = ("<|user|>", "<|observation|>", "<|endoftext|>", "<|assistant|>", "<|system|>")
_ALL_TAGS = FORMAT_TAGS + STOP_TAGS
_TAG_RE = re.compile("|".join(re.escape(t) for t in _ALL_TAGS))
_MAX_TAG = max(len(t) for t in _ALL_TAGS)


@dataclass
class ParsedMessage:
    """An assistant message in OpenAI form; tool call arguments are JSON strings."""

    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[dict] = field(default_factory=list)

    def to_message(self) -> dict:
        m: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            m["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            m["tool_calls"] = self.tool_calls
        return m


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def string_params(tools: Sequence[Any] | None) -> dict[str, set[str]] | None:
    """Tool name -> names of its parameters whose schema type is string. None when no tools were given.
    Takes OpenAI tool dicts (or objects with `model_dump()`, e.g. a server's request models); a malformed
    entry declares no tool rather than raising."""
    if tools is None:
        return None
    out: dict[str, set[str]] = {}
    for tool in tools:
        if callable(getattr(tool, "model_dump", None)):
            tool = tool.model_dump()
        f = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str):
            continue
        params = f.get("parameters")
        props = params.get("properties") if isinstance(params, Mapping) else None
        names = set()
        for key, schema in props.items() if isinstance(props, Mapping) else ():
            t = schema.get("type") if isinstance(schema, Mapping) else None
            if t == "string" or t == ["string"]:
                names.add(key)
        out[f["name"]] = names
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_value(raw: str, is_string: bool) -> Any:
    """An argument value as GLM-5's parsers decode it: string-typed stays raw; else JSON if it parses, else raw."""
    if is_string:
        return raw
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        return raw


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class _TextChannel:
    """Reasoning or content: deltas whose concatenation is the stripped concatenation of everything written."""

    def __init__(self, key: str):
        self.key = key
        self.started = False
        self.held = ""  # trailing whitespace, sent only if more text follows

    def write(self, text: str, out: list[dict]) -> None:
        if not self.started:
            text = text.lstrip()
            if not text:
                return
            self.started = True
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body) :]
        if body:
            out.append({self.key: body})


class StreamParser:
    """Incremental GLM-5 completion parser. `feed(delta)` and `finish()` return OpenAI `delta` dicts:
    `{"reasoning_content": s}`, `{"content": s}`, or `{"tool_calls": [{"index", "id", "type", "function":
    {"name", "arguments": ""}}]}` once a call's name is complete, then `{"tool_calls": [{"index", "function":
    {"arguments": fragment}}]}`. Feeding text in any pieces gives the same accumulated result."""

    def __init__(self, tools: Sequence[Mapping] | None = None, thinking: bool = True):
        self._strings = string_params(tools)
        self._pending = ""
        self._state = "reasoning" if thinking else "content"
        self._reasoning = _TextChannel("reasoning_content")
        self._content = _TextChannel("content")
        self._fresh = True  # nothing but whitespace seen yet
        self._n_calls = 0
        self._finished = False
        # The call being read: its raw text (kept until the name proves valid), name, current key and value.
        self._call: dict = {}
        self._raw = self._name = self._key = self._value = ""
        self._streaming = False  # the current value is string-typed and sent as it arrives

    @property
    def has_tool_calls(self) -> bool:
        return self._n_calls > 0

    # ---- input ----
    def feed(self, text: str) -> list[dict]:
        if self._finished:
            raise RuntimeError("StreamParser.feed after finish")
        buf = self._pending + text
        out: list[dict] = []
        pos = 0
        for m in _TAG_RE.finditer(buf):
            if m.start() > pos:
                self._text(buf[pos : m.start()], out)
            self._tag(m.group(), out)
            pos = m.end()
        tail = buf[pos:]
        hold = 0
        for k in range(min(len(tail), _MAX_TAG - 1), 0, -1):
            if any(t.startswith(tail[-k:]) for t in _ALL_TAGS):
                hold = k
                break
        if len(tail) > hold:
            self._text(tail[: len(tail) - hold], out)
        self._pending = tail[len(tail) - hold :]
        return _coalesce(out)

    def finish(self) -> list[dict]:
        """Flush what is held back and close an unfinished tool call."""
        if self._finished:
            return []
        out: list[dict] = []
        if self._pending:
            self._text(self._pending, out)
            self._pending = ""
        self._end_turn(out)
        self._finished = True
        return _coalesce(out)

    # ---- state machine ----
    def _text(self, text: str, out: list[dict]) -> None:
        s = self._state
        if self._fresh and text.strip():
            self._fresh = False
        if s == "reasoning":
            self._reasoning.write(text, out)
        elif s == "content":
            self._content.write(text, out)
        elif s == "name":
            self._raw += text
            self._name += text
        elif s == "key":
            self._key += text
        elif s == "value":
            self._value_text(text, out)
        elif s == "invalid":
            self._content.write(text, out)
        # wait_value, args, done: text there is ignored

    def _tag(self, tag: str, out: list[dict]) -> None:
        s = self._state
        fresh, self._fresh = self._fresh, False
        if s == "done":
            return
        if tag in STOP_TAGS:
            self._end_turn(out)
            return
        if s == "reasoning":
            if tag == "</think>":
                self._state = "content"
            elif tag == "<tool_call>":
                self._start_call()
            elif not (tag == "<think>" and not self._reasoning.started):
                self._reasoning.write(tag, out)
        elif s == "content":
            if tag == "<tool_call>":
                self._start_call()
            elif tag == "<think>" and fresh and self._n_calls == 0:
                self._state = "reasoning"
            else:
                self._content.write(tag, out)
        elif s == "name":
            if tag == "<arg_key>":
                if self._end_name(out, closing=False):
                    self._state, self._key = "key", ""
                else:
                    self._content.write(tag, out)
                    self._state = "invalid"
            elif tag == "</tool_call>":
                valid = self._end_name(out, closing=True)
                if not valid:
                    self._content.write(tag, out)
                self._state = "content"
            else:
                self._raw += tag
                self._name += tag
        elif s == "key":
            if tag == "</arg_key>":
                self._key = self._key.strip()
                self._state = "wait_value"
            elif tag == "</tool_call>":
                self._close_call(out)
            else:
                self._key += tag
        elif s == "wait_value":
            if tag == "<arg_value>":
                self._start_value(out)
            elif tag == "<arg_key>":
                self._state, self._key = "key", ""
            elif tag == "</tool_call>":
                self._close_call(out)
        elif s == "value":
            if tag == "</arg_value>":
                self._end_value(out)
                self._state = "args"
            elif tag == "</tool_call>":
                self._end_value(out)
                self._close_call(out)
            else:
                self._value_text(tag, out)
        elif s == "args":
            if tag == "<arg_key>":
                self._state, self._key = "key", ""
            elif tag == "</tool_call>":
                self._close_call(out)
        elif s == "invalid":
            self._content.write(tag, out)
            if tag == "</tool_call>":
                self._state = "content"

    def _end_turn(self, out: list[dict]) -> None:
        """End of the turn (end of text, or a stop tag): close what is open; later text is ignored."""
        s = self._state
        if s == "name":
            self._end_name(out, closing=True)
        elif s in ("key", "wait_value", "args"):
            self._close_call(out)
        elif s == "value":
            self._end_value(out)
            self._close_call(out)
        self._state = "done"

    # ---- tool calls ----
    def _start_call(self) -> None:
        self._state, self._raw, self._name = "name", "<tool_call>", ""

    def _end_name(self, out: list[dict], closing: bool) -> bool:
        """Send the call's name if it is valid; else put the raw call text into content. Returns validity."""
        name = self._name.strip()
        valid = bool(name) and (self._strings is None or name in self._strings)
        if not valid:
            self._content.write(self._raw, out)
            return False
        self._call = {"index": self._n_calls, "name": name, "n_args": 0}
        self._n_calls += 1
        out.append(
            {
                "tool_calls": [
                    {
                        "index": self._call["index"],
                        "id": new_call_id(),
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                ]
            }
        )
        if closing:
            self._close_call(out)
        return True

    def _args(self, fragment: str, out: list[dict]) -> None:
        out.append({"tool_calls": [{"index": self._call["index"], "function": {"arguments": fragment}}]})

    def _is_string(self, key: str) -> bool:
        return self._strings is not None and key in self._strings.get(self._call["name"], ())

    def _start_value(self, out: list[dict]) -> None:
        self._state, self._value = "value", ""
        self._streaming = self._is_string(self._key)
        if self._streaming:
            self._args(("{" if self._call["n_args"] == 0 else ", ") + _dump(self._key) + ': "', out)
            self._call["n_args"] += 1

    def _value_text(self, text: str, out: list[dict]) -> None:
        if self._streaming:
            if text:
                self._args(_dump(text)[1:-1], out)
        else:
            self._value += text

    def _end_value(self, out: list[dict]) -> None:
        if self._streaming:
            self._args('"', out)
            return
        value = decode_value(self._value, False)
        self._args(("{" if self._call["n_args"] == 0 else ", ") + _dump(self._key) + ": " + _dump(value), out)
        self._call["n_args"] += 1

    def _close_call(self, out: list[dict]) -> None:
        self._args("}" if self._call["n_args"] else "{}", out)
        self._state = "content"


def _coalesce(deltas: list[dict]) -> list[dict]:
    """Merge neighbouring text deltas of one kind and neighbouring argument fragments of one call."""
    out: list[dict] = []
    for d in deltas:
        prev = out[-1] if out else None
        if prev is not None and "tool_calls" not in d and d.keys() == prev.keys():
            key = next(iter(d))
            out[-1] = {key: prev[key] + d[key]}
            continue
        if (
            prev is not None
            and "tool_calls" in d
            and "tool_calls" in prev
            and "id" not in d["tool_calls"][0]
            and "id" not in prev["tool_calls"][0]
            and d["tool_calls"][0]["index"] == prev["tool_calls"][0]["index"]
        ):
            p = prev["tool_calls"][0]
            merged = {
                **p,
                "function": {
                    **p["function"],
                    "arguments": p["function"]["arguments"] + d["tool_calls"][0]["function"]["arguments"],
                },
            }
            out[-1] = {"tool_calls": [merged]}
            continue
        out.append(d)
    return out


def accumulate(deltas: Sequence[Mapping]) -> ParsedMessage:
    """The message a sequence of deltas adds up to (what a streaming client reconstructs)."""
    reasoning, content = [], []
    calls: dict[int, dict] = {}
    for d in deltas:
        if "reasoning_content" in d:
            reasoning.append(d["reasoning_content"])
        if "content" in d:
            content.append(d["content"])
        for tc in d.get("tool_calls", ()):
            call = calls.setdefault(
                tc["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if tc.get("id"):
                call["id"] = tc["id"]
            f = tc.get("function", {})
            call["function"]["name"] += f.get("name") or ""
            call["function"]["arguments"] += f.get("arguments") or ""
    return ParsedMessage(
        reasoning_content="".join(reasoning) or None,
        content="".join(content) or None,
        tool_calls=[calls[i] for i in sorted(calls)],
    )


def parse(text: str, tools: Sequence[Mapping] | None = None, thinking: bool = True) -> ParsedMessage:
    """A whole completion as an assistant message (see the module docstring for the rules)."""
    p = StreamParser(tools=tools, thinking=thinking)
    return accumulate(p.feed(text) + p.finish())
