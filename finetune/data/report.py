"""What a data load used and what it left out: every skipped record with its file and line, every filter's count.

`--strict` turns the first skipped record into an error (BadRecord) instead; filtered data (a denied tool call,
an unresolved trial) is a choice the user made with flags, never an error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


class BadRecord(ValueError):
    """A record that cannot be read, named by "FILE:LINE: why" (raised with strict=True)."""


@dataclass
class DataReport:
    strict: bool = False
    files: int = 0
    sessions: int = 0
    sequences: int = 0
    tito: int = 0  # sequences made of the recorded token ids
    tokens: int = 0
    targets: int = 0
    truncated: int = 0  # sequences cut to max_len
    prefix_past_max_len: int = 0  # the shortest prompt (tokens before a first target) of those max_len left empty
    skipped: list[str] = field(default_factory=list)  # "FILE:LINE: why"
    filtered: Counter = field(default_factory=Counter)  # what a filter left out -> how many

    def skip(self, where: str, why: str) -> None:
        if self.strict:
            raise BadRecord(f"{where}: {why}")
        self.skipped.append(f"{where}: {why}")

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "sessions": self.sessions,
            "sequences": self.sequences,
            "tito_sequences": self.tito,
            "rendered_sequences": self.sequences - self.tito,
            "tokens": self.tokens,
            "target_tokens": self.targets,
            "truncated_to_max_len": self.truncated,
            "prefix_past_max_len": self.prefix_past_max_len,
            "skipped_records": list(self.skipped),
            "filtered": dict(self.filtered),
        }
