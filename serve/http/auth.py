"""Bearer-token auth for the API routes (`--api-key` / GLM5_API_KEY), as a plain ASGI middleware.

A plain ASGI wrapper rather than Starlette's BaseHTTPMiddleware: it must not sit between a streaming response and
the client's disconnect message, or a hung-up stream would keep generating. /health and /metrics stay open, as
load balancers and Prometheus scrape them without credentials.
"""

from __future__ import annotations

import hmac

from serve.http.errors import APIError

OPEN_PATHS = ("/health", "/health_generate", "/metrics")


class BearerAuth:
    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            reason = "no API key was sent" if not given else "the API key is not valid"
            err = APIError(401, f"{reason}; send 'Authorization: Bearer <key>'", code="invalid_api_key")
            return await err.response()(scope, receive, send)
        return await self.app(scope, receive, send)
