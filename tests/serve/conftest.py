"""Fixtures for serve tests: free loopback ports."""

from __future__ import annotations

import socket

import pytest


def find_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    return find_free_port()
