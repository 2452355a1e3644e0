"""Fixtures for serve tests: free loopback ports."""

from __future__ import annotations

import socket

import openai
import pytest


def find_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    return find_free_port()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A real checkpoint directory: the `tiny` preset with random weights, and glm5's shipped tokenizer files."""
    from model.config import preset
    from model.modeling import GLM5ForCausalLM
    from model.tokenizer import save_tokenizer_files

    path = tmp_path_factory.mktemp("tiny-glm5")
    GLM5ForCausalLM.from_config(preset("tiny"), seed=0).save_pretrained(path)
    save_tokenizer_files(path)
    return path


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint):
    """The real embedded engine over the tiny checkpoint (context 512, 16 sequences at once), shared by the
    HTTP tests: (EmbeddedEngine, Tokenizer)."""
    from rich.console import Console

    from serve.http.server import load_engine

    engine, tok = load_engine(tiny_checkpoint, None, False, 16, 512, Console(quiet=True), kv_cache_gib=0.05)
    yield engine, tok
    engine.shutdown()


@pytest.fixture
def client(server):
    """The official `openai` client against the module's `server` fixture (a ServerThread)."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def ask(text: str) -> list[dict]:
    """A one-message chat."""
    return [{"role": "user", "content": text}]
