"""The conversation checks OpenAI makes that the template would let through, with OpenAI's own messages.

- A system, user or tool message must have `content` (a string or a list of parts); only an assistant message
  that calls tools may leave it out or send null.
- A `tool` message must answer a tool call: it follows an assistant message with `tool_calls` (other tool
  results may come between), and when both sides carry ids, its `tool_call_id` is one of that message's calls.

Shapes and types of the rest are model/chat.py's business (its errors become 400s in chat.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from serve.http.errors import bad_request


def check_messages(messages: Sequence) -> None:
    calls: list | None = None  # the tool calls of the assistant turn tool messages may answer, if any
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            continue  # model/chat.py names the problem
        role = m.get("role")
        if role in ("system", "user", "tool", "developer"):
            if "content" not in m:
                raise bad_request(
                    f"Missing required parameter: 'messages[{i}].content'.", param=f"messages[{i}].content"
                )
            if m["content"] is None:
                raise bad_request(
                    f"Invalid type for 'messages[{i}].content': expected one of a string or array of objects, "
                    "but got null instead.",
                    param=f"messages[{i}].content",
                )
        if role == "assistant":
            tool_calls = m.get("tool_calls")
            if tool_calls is not None and not isinstance(tool_calls, list):
                raise bad_request(
                    f"Invalid type for 'messages[{i}].tool_calls': expected an array of objects.",
                    param=f"messages[{i}].tool_calls",
                )
            calls = list(tool_calls or []) or None
        elif role == "tool":
            if calls is None:
                raise bad_request(
                    f"Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                    f"'tool_calls' (messages[{i}] answers none).",
                    param=f"messages[{i}].role",
                )
            ids = [c.get("id") for c in calls if isinstance(c, Mapping) and c.get("id")]
            given = m.get("tool_call_id")
            if given and ids and given not in ids:
                raise bad_request(
                    f"Invalid parameter: 'messages[{i}].tool_call_id' {given!r} answers none of the tool calls of "
                    f"the assistant message before it ({', '.join(map(repr, ids))}).",
                    param=f"messages[{i}].tool_call_id",
                )
        else:
            calls = None  # a user or system message ends the run of results a call may receive
