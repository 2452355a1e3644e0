"""JSON and JSONL files read as the untrusted input they are: each value with its line, or why it cannot be read.

Every reader of data names a record it cannot read the same way: "FILE:LINE: not JSON (what the parser said)", or
"unreadable JSON (the error)" for nesting past the stack or a number past the digit limit. What a reader does
with it (report it and go on, or raise) is its own business.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune.data.report import DataReport

UNREAD = object()  # what json_file returns for a file it reported as unreadable (a file may hold `null`)


def why_unreadable(e: ValueError | RecursionError, detail: bool = False) -> str:
    """What `json.loads` raised, in the words the data's report uses; `detail` adds the error's own text."""
    if isinstance(e, json.JSONDecodeError):
        return f"not JSON ({e.msg})"
    return f"unreadable JSON ({type(e).__name__}: {str(e)[:80]})" if detail else f"unreadable JSON ({type(e).__name__})"


def jsonl_rows(path: Path, errors: str | None = None, detail: bool = False) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, value, None) for every non-blank line of `path`, or (line number, None, why) for one that
    cannot be read (a torn last line included). `errors`: open()'s handling of bytes that are not UTF-8."""
    with open(path, encoding="utf-8", errors=errors) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except (ValueError, RecursionError) as e:  # nesting past the stack, a number past the digit limit
                yield n, None, why_unreadable(e, detail)
                continue
            yield n, value, None


def json_file(path: Path, report: DataReport) -> Any:
    """The value in the JSON file `path`, or UNREAD when it cannot be read (reported by FILE:LINE)."""
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        report.skip(f"{path}:{e.lineno}", why_unreadable(e))
    except (ValueError, RecursionError) as e:
        report.skip(f"{path}:1", why_unreadable(e))
    return UNREAD
