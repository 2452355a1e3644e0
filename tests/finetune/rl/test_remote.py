"""Rollout servers over HTTP (finetune/rl/remote.py): a run against a real `glm5 serve` pushes its LoRA adapter after
every step (/load_lora_adapter) and the server's version moves with it; sessions stick to one replica by
consistent hashing."""

from __future__ import annotations

import httpx
import pytest
from rich.console import Console

from finetune.grpo import RL_TARGETS
from finetune.rl.config import RLConfig
from finetune.rl.remote import HttpServer, Router
from finetune.rl.run import run_rl
from finetune.rl.scripted import ScriptedFamily, digit_tasks
from finetune.sft import LoraSettings, add_lora
from model import GLM5ForCausalLM
from serve.http.app import create_app
from serve.http.server import load_engine
from serve.http.settings import ServerSettings
from tests.serve.conftest import tiny_checkpoint  # noqa: F401 (a fixture)
from tests.serve.server_thread import ServerThread


class Fake:
    def __init__(self, name):
        self.name, self.version, self.sessions = name, 0, []

    def generate(self, prompt_ids, params, session=""):
        self.sessions.append(session)

    def set_version(self, v):
        self.version = v


def test_every_call_of_a_session_goes_to_one_replica_and_sessions_spread():
    servers = [Fake(i) for i in range(3)]
    router = Router(servers)
    for s in range(300):
        for _ in range(3):
            router.generate([1], None, f"g{s}-s0")
    for srv in servers:
        assert 50 < len(srv.sessions) < 150 * 3  # spread over all three
    owners = {sess: {i for i, srv in enumerate(servers) if sess in srv.sessions} for sess in servers[0].sessions}
    assert all(len(o) == 1 for o in owners.values())
    # A fourth replica moves only the sessions it now owns (consistent hashing), not everyone.
    bigger = Router([Fake(i) for i in range(4)])
    moved = sum(router.route(f"g{s}-s0") != bigger.route(f"g{s}-s0") for s in range(300))
    assert moved < 150


@pytest.fixture
def serve(tiny_checkpoint):  # noqa: F811
    engine, tok = load_engine(tiny_checkpoint, None, False, 8, 512, Console(quiet=True), kv_cache_gib=0.02)
    with ServerThread(create_app(engine, tok, ServerSettings("tiny", api_key="k"))) as s:
        s.wait_healthy()
        yield s, tok
    engine.shutdown()


def test_a_run_against_glm5_serve_pushes_its_adapter_and_the_servers_version_moves(serve, tiny_checkpoint, tmp_path):  # noqa: F811
    server, tok = serve

    def served_version() -> int:
        r = httpx.get(server.url + "/get_weight_version", headers={"Authorization": "Bearer k"}, timeout=30)
        return int(r.json()["weight_version"])

    start = served_version()
    model = add_lora(GLM5ForCausalLM.from_pretrained(tiny_checkpoint), LoraSettings(4, 8, targets=RL_TARGETS))
    router = Router([HttpServer(server.url + "/v1", api_key="k")])
    seen = []
    cfg = RLConfig(steps=2, groups_per_step=1, group_size=2, max_new_tokens=4, lr=1e-2, max_staleness=1, concurrency=4)
    hist = run_rl(model, tok, ScriptedFamily(), digit_tasks(2), cfg, tmp_path, server=router,
                  log=lambda row: seen.append(served_version()))  # fmt: skip
    # one push when the run starts (the server then serves the trainer's weights), one after each step
    assert seen == [start + 2, start + 3]
    assert [h["version"] for h in hist] == [1, 2]
    assert all(int(lag) <= 1 for h in hist for lag in h["staleness_hist"])
    assert hist[0]["mismatch"] < 1e-3  # the server samples with the trainer's weights (LoRA merged into them)
    assert sorted(p.name for p in (tmp_path / "pushes").iterdir()) == ["v2"]  # older pushes were cleaned up
