"""Conversations the chat-format tests run on: every shape of OpenAI message the product sends or stores.

Each entry is (name, messages, tools). Arguments come both as JSON strings (OpenAI wire form) and as dicts.
A string argument whose text would parse as JSON (e.g. "42") only appears under a tool whose schema says
`string`, because GLM-5's parsers decode untyped values as JSON.
"""

from __future__ import annotations

import json


def _fn(name: str, props: dict, description: str = "") -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description or f"The {name} tool.",
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }


WEATHER = _fn("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, "Weather forecast for a city.")
SHELL = _fn("run_shell", {"command": {"type": "string"}, "timeout": {"type": "number"}}, "Run a shell command.")
EDIT = _fn("edit_file", {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}})
SEARCH = _fn(
    "search",
    {
        "query": {"type": "string"},
        "filters": {"type": "object"},
        "limit": {"type": "integer"},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "cursor": {"type": ["string", "null"]},
    },
)
LIST_FILES = {"type": "function", "function": {"name": "list_files", "description": "List files.", "parameters": {}}}
RECORD = _fn("record", {"data": {"type": "object"}, "score": {"type": "number"}, "note": {"type": "null"}})
ALL_TOOLS = [WEATHER, SHELL, EDIT, SEARCH, LIST_FILES, RECORD]


def call(name: str, args, call_id: str = "call_0", as_string: bool = True) -> dict:
    arguments = json.dumps(args, ensure_ascii=False) if as_string else args
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def U(text):  # noqa: N802 - short constructors keep the corpus readable
    return {"role": "user", "content": text}


def S(text):  # noqa: N802
    return {"role": "system", "content": text}


def A(content, reasoning=None, calls=None, **extra):  # noqa: N802
    m = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if calls:
        m["tool_calls"] = calls
    m.update(extra)
    return m


def T(text, call_id="call_0"):  # noqa: N802
    return {"role": "tool", "tool_call_id": call_id, "content": text}


CORPUS: list[tuple[str, list[dict], list[dict] | None]] = [
    ("single_turn", [U("Hello!"), A("Hi, how can I help?")], None),
    ("system_user_assistant", [S("You are terse."), U("2+2?"), A("4", reasoning="Simple sum.")], None),
    (
        "multi_turn_reasoning_every_turn",
        [
            U("Name a prime."),
            A("7", reasoning="Pick a small prime."),
            U("Another?"),
            A("11", reasoning="Next one above 7."),
            U("And one more."),
            A("13", reasoning="Then 13."),
        ],
        None,
    ),
    (
        "tool_call_json_string_args",
        [
            U("Weather in Oslo?"),
            A("", reasoning="Ask the tool.", calls=[call("get_weather", {"city": "Oslo", "days": 2})]),
            T('{"celsius": 12}'),
            A("12 °C in Oslo.", reasoning="It says 12."),
        ],
        [WEATHER],
    ),
    (
        "parallel_tool_calls",
        [
            S("Use tools."),
            U("Compare Paris and Rome."),
            A(
                "Checking both.",
                reasoning="Two lookups at once.",
                calls=[
                    call("get_weather", {"city": "Paris", "days": 1}, "call_a"),
                    call("get_weather", {"city": "Rome", "days": 1}, "call_b"),
                ],
            ),
            T("Paris: 18", "call_a"),
            T("Rome: 24", "call_b"),
            A("Rome is warmer.", reasoning="24 > 18."),
        ],
        [WEATHER],
    ),
    (
        "non_string_argument_values",
        [
            U("Search for it."),
            A(
                None,
                reasoning="Use all the filters.",
                calls=[
                    call(
                        "search",
                        {
                            "query": "tensor parallel",
                            "filters": {"lang": ["py", "cu"], "stars": {"min": 10}, "nested": [1, [2, 3], None]},
                            "limit": 25,
                            "exact": False,
                            "tags": ["a", "b"],
                            "cursor": None,
                        },
                    )
                ],
            ),
            T("[]"),
            A("Nothing found."),
        ],
        [SEARCH],
    ),
    (
        "numbers_and_floats",
        [
            U("Record it."),
            A(
                "",
                calls=[
                    call("record", {"data": {"x": 1.5, "y": -2, "z": 1e-3, "big": 12345678901234567890}, "score": 0.25})
                ],
            ),
            T("ok"),
        ],
        [RECORD],
    ),
    (
        "unicode_everywhere",
        [
            S("Réponds en français. 你好 🌍"),
            U("Qu'est-ce que «naïve» ? مرحبا — ζ∑"),
            A("C'est un mot 🙂 avec tréma.", reasoning="L'utilisateur demande: naïve → tréma. 北京"),
            U("天气？"),
            A("", calls=[call("get_weather", {"city": "北京", "days": 3})], reasoning="查询天气"),
            T("晴，25°C"),
            A("北京晴天，25°C ☀️"),
        ],
        [WEATHER],
    ),
    (
        "empty_and_null_content",
        [
            U(""),
            A("", reasoning="Nothing was asked."),
            U("List files."),
            A(None, calls=[call("list_files", {})]),
            T(""),
            A("The directory is empty."),
        ],
        [LIST_FILES],
    ),
    (
        "reasoning_old_and_new_turns_with_tools",
        [
            U("Fix the test."),
            A("Running tests.", reasoning="First run them.", calls=[call("run_shell", {"command": "pytest -q"})]),
            T("1 failed"),
            A("", reasoning="Look at the failure.", calls=[call("run_shell", {"command": "pytest -q -x --tb=short"})]),
            T("AssertionError: 3 != 4"),
            A("Off by one in add().", reasoning="The sum is off by one."),
            U("Patch it."),
            A(
                "",
                reasoning="Edit the file.",
                calls=[call("edit_file", {"path": "calc.py", "old": "return a + b - 1", "new": "return a + b"})],
            ),
            T("edited"),
            A("Done.", reasoning="Patched."),
        ],
        [SHELL, EDIT],
    ),
    (
        "reasoning_inline_in_content",
        [U("Why?"), A("<think>\nBecause of X.\n</think>\n\nBecause of X."), U("Sure?"), A("Yes.")],
        None,
    ),
    (
        "content_as_text_parts",
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Cite."}]},
            {"role": "user", "content": [{"type": "text", "text": "Part one, "}, "part two."]},
            A("Both parts read."),
        ],
        None,
    ),
    (
        "multiline_tool_output",
        [
            U("Show the file."),
            A("", calls=[call("run_shell", {"command": "cat setup.cfg"})]),
            T("[metadata]\nname = demo\n\n[options]\npackages = find:\n"),
            A("It is a setuptools config."),
        ],
        [SHELL],
    ),
    (
        "json_looking_tool_output",
        [
            U("Status?"),
            A("", calls=[call("run_shell", {"command": "gh pr view --json state"})]),
            T('{"state": "OPEN", "checks": [true, false]}'),
            A("The PR is open; one check failed."),
        ],
        [SHELL],
    ),
    (
        "no_argument_call_dict_args",
        [U("ls"), A("", calls=[call("list_files", {}, as_string=False)]), T("a.py\nb.py")],
        [LIST_FILES],
    ),
    (
        "whitespace_is_stripped_in_assistant",
        [
            U("  spaced user text \n"),
            A("\n\n  Answer with spaces.  \n", reasoning="\n  padded reasoning  \n"),
        ],
        None,
    ),
    (
        "code_edit_preserves_indentation",
        [
            U("Indent the body."),
            A(
                "Editing.",
                calls=[
                    call(
                        "edit_file",
                        {
                            "path": "pkg/mod.py",
                            "old": "def f(x):\nreturn x\n",
                            "new": "def f(x):\n    return x\n\n\n",
                        },
                    )
                ],
            ),
            T("ok"),
        ],
        [EDIT],
    ),
    (
        "string_values_that_look_like_json",
        [
            U("Run these."),
            A(
                "",
                calls=[
                    call("run_shell", {"command": "42", "timeout": 5}, "c1"),
                    call("run_shell", {"command": "true", "timeout": 0.5}, "c2"),
                    call("run_shell", {"command": '{"a": 1}', "timeout": 1}, "c3"),
                    call("edit_file", {"path": "null", "old": "[1, 2]", "new": ' "quoted" '}, "c4"),
                ],
            ),
            T("42", "c1"),
            T("", "c2"),
            T("", "c3"),
            T("edited", "c4"),
        ],
        [SHELL, EDIT],
    ),
    ("reasoning_only_no_content", [U("Think only."), A("", reasoning="Just thinking here.")], None),
    (
        "ends_with_tool_result",
        [
            S("Agent."),
            U("Build."),
            A("", reasoning="Build it.", calls=[call("run_shell", {"command": "make"})]),
            T("ok"),
        ],
        [SHELL],
    ),
    ("ends_with_user", [U("First."), A("Noted."), U("Second.")], None),
    ("system_only_then_user", [S("You are glm5."), U("Who are you?")], None),
    ("two_system_messages", [S("Rule one."), S("Rule two."), U("Go."), A("Following both rules.")], None),
    (
        "call_without_function_wrapper",
        [U("Weather?"), A("", calls=[{"id": "x", "name": "get_weather", "arguments": {"city": "Lima", "days": 1}}])],
        [WEATHER],
    ),
    (
        "long_agent_loop",
        [
            S("You are a coding agent."),
            U("Add a --verbose flag."),
            A("", reasoning="Find the CLI.", calls=[call("run_shell", {"command": "grep -rn argparse ."}, "s1")]),
            T("cli.py:3:import argparse", "s1"),
            A("", reasoning="Read it.", calls=[call("run_shell", {"command": "sed -n 1,40p cli.py"}, "s2")]),
            T("import argparse\np = argparse.ArgumentParser()\n", "s2"),
            A(
                "",
                reasoning="Add the flag.",
                calls=[
                    call(
                        "edit_file",
                        {
                            "path": "cli.py",
                            "old": "p = argparse.ArgumentParser()\n",
                            "new": "p = argparse.ArgumentParser()\np.add_argument('--verbose', action='store_true')\n",
                        },
                        "s3",
                    )
                ],
            ),
            T("edited", "s3"),
            A(
                "",
                reasoning="Test.",
                calls=[call("run_shell", {"command": "python cli.py --verbose", "timeout": 30}, "s4")],
            ),
            T("", "s4"),
            A("Added `--verbose`.", reasoning="Works."),
        ],
        [SHELL, EDIT],
    ),
    ("reasoning_alias_field", [U("Hi"), {"role": "assistant", "content": "Hello.", "reasoning": "Greet back."}], None),
    (
        "markup_characters",
        [
            U('Escape <b>&amp;</b> "quotes" and \\backslashes\\ and {braces} {{jinja}} {% raw %}'),
            A('Use `&lt;` for <, and "\\n" for newlines. {{x}}', reasoning="HTML & Jinja-looking text stays raw."),
        ],
        None,
    ),
    ("tools_declared_but_unused", [U("Just chat."), A("Sure, no tools needed.")], [WEATHER, SHELL]),
    ("assistant_then_assistant", [U("Go."), A("Part one."), A("Part two.")], None),
    ("assistant_then_system", [U("Go."), A("Done."), S("New rules."), U("Again."), A("Again done.")], None),
    (
        "unicode_keys_and_multiline_values",
        [
            U("Record."),
            A("", calls=[call("record", {"data": {"ключ": "значение", "emoji": "🎉", "text": "line1\nline2\ttab"}})]),
            T("saved"),
            A("Saved."),
        ],
        [RECORD],
    ),
    (
        "all_tools_many_calls",
        [
            U("Do everything."),
            A(
                "Starting.",
                reasoning="Several calls in one turn.",
                calls=[
                    call("list_files", {}, "m1"),
                    call("get_weather", {"city": "Zürich", "days": 7}, "m2"),
                    call("search", {"query": "q", "filters": {}, "limit": 0, "exact": True, "tags": []}, "m3"),
                ],
            ),
            T("x", "m1"),
            T("y", "m2"),
            T("z", "m3"),
            A("All done."),
            U("Thanks"),
            A("You're welcome.", reasoning="Polite close."),
        ],
        ALL_TOOLS,
    ),
    (
        "text_parts_in_assistant_and_tool",
        [
            U("Read it."),
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Reading "}, {"type": "text", "text": "now."}],
                "tool_calls": [call("run_shell", {"command": "cat a.txt"})],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": [{"type": "text", "text": "line 1\n"}, "line 2"]},
            A("Two lines."),
        ],
        [SHELL],
    ),
]

NAMES = [name for name, _, _ in CORPUS]
assert len(CORPUS) >= 30 and len(set(NAMES)) == len(NAMES)


def assistant_messages() -> list[tuple[str, int, dict, list[dict] | None]]:
    """(conversation name, index, message, tools) for every assistant message of the corpus."""
    return [(n, i, m, tools) for n, msgs, tools in CORPUS for i, m in enumerate(msgs) if m["role"] == "assistant"]
