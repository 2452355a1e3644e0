"""The server's log lines, safe for the operator's terminal.

A request's path, a model name or an exception's message is the client's text, and the log goes to a terminal (or a
journal that one will show). Unescaped, `GET /%1b%5d2%3bx%07` would set the operator's terminal title, and a
`%0a` would forge a log line of its own. `escape` writes every character that is not printable as its Python
escape (`\\x1b`, `\\n`, `\\u202e`); `SafeFormatter` does that to every message and keeps a traceback's own lines;
`SafeConsole` to what `glm5 serve` prints.
"""

from __future__ import annotations

import logging
from typing import Any

from rich.console import Console


def escape(text: object, keep: str = "") -> str:
    """`text` with every non-printable character (controls, line breaks, bidirectional overrides) but those in
    `keep` written as its escape: one line, as printed."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in s)


class SafeFormatter(logging.Formatter):
    """A Formatter whose record messages are one escaped line, and whose tracebacks keep only their newlines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        return escape(super().formatException(ei), keep="\n")

    def formatStack(self, stack_info: str) -> str:
        return escape(super().formatStack(stack_info), keep="\n")


class SafeConsole(Console):
    """`glm5 serve`'s console: what it prints (a checkpoint's file names, its template's origin) escaped the same way,
    its own newlines and tabs kept."""

    def render_str(self, text: str, **kw: Any):
        return super().render_str(escape(text, keep="\n\t"), **kw)


def configure(level: int = logging.INFO) -> None:
    """The server's logging: one stderr handler, `SafeFormatter`, as `logging.basicConfig` would set it up."""
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
