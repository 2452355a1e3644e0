"""Run an ASGI app under a real uvicorn server on a loopback port, in a background thread, for tests."""

from __future__ import annotations

import threading
import time

import httpx
import uvicorn

from tests.serve.conftest import find_free_port


class ServerThread:
    def __init__(self, app, port: int | None = None):
        self.port = port or find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if httpx.get(self.url + "/health").status_code == 200:
                return
            time.sleep(0.05)
        raise TimeoutError("/health never answered 200")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
