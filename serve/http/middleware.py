"""Two plain ASGI wrappers every request passes: the request-body size limit and the access log.

Plain ASGI (as auth.py, and for the same reason): nothing may sit between a streaming response and the client's
disconnect. `BodyLimit` answers 413 before reading a body whose Content-Length is over the limit, and stops
reading a chunked body the moment it grows past it (so a 50 MB upload costs the server at most the limit).
`AccessLog` writes one line per request when its response has ended -- streamed or not, however it ended:
client address, method, path (escaped: it is the client's text), status, bytes sent, duration.
"""

from __future__ import annotations

import logging
import time

from serve.http.errors import APIError
from serve.http.logs import escape

access_log = logging.getLogger("glm5.access")


class Watched:
    """`send`, noting whether the answer has started: after that no error answer can take its place."""

    def __init__(self, send):
        self.send, self.started = send, False

    async def __call__(self, message):
        self.started = self.started or message["type"] == "http.response.start"
        await self.send(message)


class BodyTooLarge(Exception):
    """Raised from `receive` once a body is past the limit; the app turns it into the 413 (`too_large`)."""

    def __init__(self, limit: int):
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than this server's limit of {limit / 2**20:g} MB "
        f"(glm5 serve --max-body-mb raises it)",
        code="request_too_large",
    )


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await too_large(self.max_bytes).response()(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        sent = Watched(send)
        try:
            await self.app(scope, limited_receive, sent)
        except BodyTooLarge:
            if not sent.started:
                await too_large(self.max_bytes).response()(scope, receive, send)


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def _hostname(authority: str) -> str:
    """`host:port`, `[::1]:8000` or `host` -> the host name, lower case."""
    a = authority.strip().lower()
    if a.startswith("["):
        return a[1 : a.find("]")] if "]" in a else a
    return a.rsplit(":", 1)[0] if a.count(":") == 1 else a


class InternalErrors:
    """An exception a route did not turn into an answer: a 500 with its type and message, logged, and not raised
    further (Starlette's own last layer answers and then re-raises, and uvicorn drops the connection, so the
    client's next request on it failed too). Once a streamed answer has started, it can only be cut: re-raised."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent = Watched(send)
        try:
            await self.app(scope, receive, sent)
        except Exception as exc:
            if sent.started:
                raise
            logging.getLogger("glm5.serve").exception("unhandled error")
            await APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()(scope, receive, send)


class LoopbackOnly:
    """A server bound to loopback answers only requests addressed to a loopback name and sent from no page but a
    loopback one: a page on another site cannot drive it (a cross-origin `text/plain` POST needs no preflight),
    nor reach it by DNS rebinding (a name of the attacker's that resolves to 127.0.0.1). 403 otherwise."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host, origin = headers.get("host"), headers.get("origin")
        why = None
        if host is not None and _hostname(host) not in LOOPBACK_NAMES:
            why = f"this server is bound to loopback and does not answer requests for {_hostname(host)!r}"
        elif origin is not None and origin != "null" and _hostname(origin.split("://", 1)[-1]) not in LOOPBACK_NAMES:
            why = "requests from a web page on another site are refused (the Origin header is not a loopback one)"
        elif origin == "null":
            why = "requests from a sandboxed or file:// page are refused"
        if why is None:
            return await self.app(scope, receive, send)
        await APIError(403, why).response()(scope, receive, send)


class AccessLog:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status, sent, logged = 0, 0, False

        def line() -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            client = scope.get("client") or ("-", 0)
            path = escape(scope.get("path", ""))  # decoded: %1b is an escape, %0a a line break
            access_log.info(
                '%s:%s "%s %s" %s %dB %.1fms',
                client[0],
                client[1],
                scope.get("method", "-"),
                path,
                status or "-",
                sent,
                (time.perf_counter() - t0) * 1000,
            )

        async def logging_send(message):
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                line()

        try:
            await self.app(scope, receive, logging_send)
        finally:
            line()  # the client went away mid-stream, or the app raised: still one line
