"""`glm5 serve`: the OpenAI-compatible server."""

from __future__ import annotations

from glm5cli.common import not_built


def serve() -> None:
    """Serve a GLM-5 checkpoint over an OpenAI-compatible HTTP API."""
    not_built("serve")
