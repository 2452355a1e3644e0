"""`glm5 code`: the coding agent."""

from __future__ import annotations

from glm5cli.common import not_built


def code() -> None:
    """Run the coding agent in the current git repository."""
    not_built("code")
