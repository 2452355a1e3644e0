"""What a chat request forces on the output, as a grammar for the engine's sampler (serve/engine/grammar.py).

- `tool_choice: "required"`: one or more GLM-5 tool calls to the given tools (one with
  `parallel_tool_calls: false`), arguments following each tool's parameter schema, and no text around them.
- `tool_choice: {"type": "function", "function": {"name": ...}}`: one call to that function.
- `response_format: {"type": "json_object"}`: a JSON object; `{"type": "json_schema", "json_schema": {"schema":
  ...}}`: JSON that follows the schema. With thinking on, free reasoning comes first, up to `</think>` (the
  prompt opened the think block), then the JSON.

A forced tool call turns thinking off (as before constrained decoding: the call is the whole turn). A forced call
wins over `response_format` (the turn has no content to format). Everything else is unconstrained.

/generate takes sglang's `sampling_params.json_schema` (a JSON string), `regex` and `ebnf` (`generate_constraint`).

Compiling can take seconds: the routes call these functions in a worker thread, off the event loop.

The grammars need xgrammar (`glm5[grammar]`); without it these requests get a 400 that says how to install it,
never an unconstrained answer that pretends to follow the request.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from serve.engine import grammar
from serve.http.errors import bad_request
from serve.http.protocol import ChatCompletionRequest, NamedToolChoice

# The largest grammar source (a schema's JSON text, a regex, an EBNF grammar) compiled: compiling takes time and
# memory that grow with it, and real schemas are a few KB.
MAX_GRAMMAR_SOURCE = 256 * 1024
_GRAMMARS_LOCK = threading.Lock()


def _check_size(source: str, param: str) -> None:
    if len(source) > MAX_GRAMMAR_SOURCE:
        raise bad_request(
            f"{param} is {len(source)} characters; grammars (schemas, regexes) are limited to "
            f"{MAX_GRAMMAR_SOURCE} characters",
            param=param,
        )


def forces_tool_call(req: ChatCompletionRequest) -> bool:
    return bool(req.tools) and (req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice))


def response_schema(req: ChatCompletionRequest) -> tuple[bool, dict | None]:
    """(whether the content must be JSON, the schema it must follow or None for any object)."""
    rf = req.response_format
    if rf is None:
        return False, None
    kind = rf.get("type", "text")
    if kind == "text":
        return False, None
    if kind == "json_object":
        return True, None
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request("response_format.json_schema must be an object", param="response_format.json_schema")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict | bool):
            raise bad_request(
                "response_format.json_schema.schema must be a JSON schema object", param="response_format.json_schema"
            )
        return True, schema if isinstance(schema, dict) else {}
    raise bad_request(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', not {kind!r}",
        param="response_format.type",
    )


def _grammars(state):
    if not grammar.available():
        return None
    with _GRAMMARS_LOCK:  # worker threads: one Grammars (and one cache) per server
        if state.grammars is None:
            state.grammars = grammar.Grammars(state.tokenizer)
    return state.grammars


def _unavailable(what: str, param: str):
    return bad_request(
        f"{what} needs constrained decoding, which this server cannot do: xgrammar is not installed. "
        f"Install it with {grammar.INSTALL_HINT} and restart the server.",
        param=param,
        code="constrained_decoding_unavailable",
    )


def chat_constraint(state, req: ChatCompletionRequest, tools: list[dict] | None, thinking: bool) -> Any:
    """The grammar a chat request's output must follow, or None. `thinking`: the prompt opened a think block."""
    if forces_tool_call(req) and tools:
        choice = req.tool_choice
        if isinstance(choice, NamedToolChoice):
            tools = [t for t in tools if t["function"]["name"] == choice.function.name]
            what, param = f"tool_choice naming {choice.function.name!r}", "tool_choice"
        else:
            what, param = "tool_choice 'required'", "tool_choice"
        grammars = _grammars(state)
        if grammars is None:
            raise _unavailable(what, param)
        # A named function is called once (as OpenAI and vLLM do); "required" allows several unless told not to.
        parallel = not isinstance(choice, NamedToolChoice) and req.parallel_tool_calls is not False
        fmt = grammars.tool_call_format(tools, parallel=parallel)
        names = ",".join(t["function"]["name"] for t in tools)
        return _compile(grammars, fmt, f"tool calls to {names}", param)
    is_json, schema = response_schema(req)
    if not is_json:
        return None
    grammars = _grammars(state)
    if grammars is None:
        raise _unavailable(f"response_format {req.response_format.get('type')!r}", "response_format")
    fmt = grammars.json_format(schema)
    if thinking:
        fmt = grammars.after_reasoning(fmt)
    return _compile(grammars, fmt, "JSON" if schema is None else "JSON schema", "response_format")


def generate_constraint(state, sp) -> Any:
    """/generate's `sampling_params.json_schema` / `regex` / `ebnf` (sglang's names) as a grammar, or None."""
    kind = next((k for k in ("json_schema", "regex", "ebnf") if getattr(sp, k) is not None), None)
    if kind is None:
        return None
    param = f"sampling_params.{kind}"
    _check_size(getattr(sp, kind), param)
    grammars = _grammars(state)
    if grammars is None:
        raise _unavailable(param, param)
    try:
        if kind == "json_schema":
            try:
                schema = json.loads(sp.json_schema)
            except json.JSONDecodeError as e:
                raise bad_request(f"{param} must be a JSON schema as a JSON string: {e}", param=param) from None
            if not isinstance(schema, dict):
                raise bad_request(f"{param} must be a JSON schema object", param=param)
            return grammars.compile(grammars.json_format(schema), "JSON schema")
        return grammars.regex(sp.regex) if kind == "regex" else grammars.ebnf(sp.ebnf)
    except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's word on what it cannot compile
        raise bad_request(f"{param} cannot be compiled to a grammar: {_said(e)}", param=param) from None


def _compile(grammars, fmt: dict, description: str, param: str):
    _check_size(json.dumps(fmt), param)
    try:
        return grammars.compile(fmt, description)
    except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's word on a schema it cannot compile
        raise bad_request(f"{param}: the schema cannot be compiled to a grammar: {_said(e)}", param=param) from None


# xgrammar's C++ errors open with a time and the source file they were raised in: "[01:31:18]
# /project/cpp/json_schema_converter.cc:5082: Unsupported type ..."; a client gets the words, not our build's paths
_CPP_PREFIX = re.compile(r"^\s*(\[[0-9:]+\]\s*)?(\S+\.(cc|cpp|h|hpp):\d+:\s*)?")


def _said(e: Exception) -> str:
    return _CPP_PREFIX.sub("", str(e)).strip()
