"""slime's custom generate-function hook: one glm5 agent session per prompt row.

    --custom-generate-function-path finetune.slime.generate.generate

slime calls `await generate(args, sample, sampling_params)` for each sample of a group (slime/rollout/
sglang_rollout.py). The row's metadata names a bench task (tasks.py); the session runs glm5's own agent loop and
tools in the bench's sandboxed trial for that task (finetune/rl/bench_env.py), its model calls going to slime's
sglang router (`args.sglang_router_ip:port`, /generate with input_ids: token in, token out, recorded by glm5's
TITO session), with the session id as the router's routing key (header X-SMG-Routing-Key, for
`--router-policy consistent_hashing`: every turn of a session reaches the replica that holds its prefix). The
bench grades it; samples.py turns the session into slime Samples, whose reward is that grade.

Settings slime's arguments do not carry come from the environment: GLM5_SLIME_MAX_TURNS (model calls per session,
default 30), GLM5_SLIME_PROFILE (the agent profile: full or compact; default the config's, else full),
GLM5_SLIME_WORKDIR (trial folders; default the temp dir), GLM5_SLIME_CACHE (the bench's repository
cache), GLM5_SLIME_API_KEY (the router's key, if any). The blocking session runs on a worker thread, so slime's
event loop keeps serving the group's other sessions.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

from finetune.rl.remote import HttpServer
from finetune.slime.samples import slime_samples
from finetune.slime.tasks import TASK_KEY, load_task

ROUTING_HEADER = "X-SMG-Routing-Key"
_TOKENIZERS: dict[str, object] = {}


async def generate(args, sample, sampling_params: dict, evaluation: bool = False) -> list:
    import asyncio

    from slime.utils.types import Sample  # slime's own type, from slime's process

    return await asyncio.to_thread(run_session, args, sample, sampling_params, Sample)


class RoutedServer(HttpServer):
    """HttpServer to one router, every request carrying the session id as the routing key."""

    def __init__(self, url: str, session: str, api_key: str | None = None):
        super().__init__(url, api_key=api_key)
        self._http.headers[ROUTING_HEADER] = session


def _tokenizer(path: str):
    if path not in _TOKENIZERS:
        from serve.engine.llm import load_tokenizer

        tok = load_tokenizer(Path(path))
        if tok is None:
            raise ValueError(f"{path} has no tokenizer.json (slime's --hf-checkpoint)")
        _TOKENIZERS[path] = tok
    return _TOKENIZERS[path]


def run_session(args, sample, sampling_params: dict, sample_type) -> list:
    """The blocking body of `generate`: one session for the row's task -> slime Samples."""
    from finetune.rl.bench_env import BenchEnv
    from finetune.rl.config import RLConfig
    from finetune.rl.orchestrator import Orchestrator

    ref = (sample.metadata or {}).get(TASK_KEY)
    if not isinstance(ref, dict):
        raise ValueError(
            f"prompt row has no metadata.{TASK_KEY}: write the data with `glm5 finetune rl --trainer slime`"
        )
    task = load_task(ref)
    session = sample.session_id or f"glm5-{sample.group_index}-{sample.index}-{uuid.uuid4().hex[:8]}"
    sample.session_id = session
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    server = RoutedServer(url, session, os.environ.get("GLM5_SLIME_API_KEY"))
    cfg = RLConfig(max_new_tokens=int(sampling_params.get("max_new_tokens", 256)),
                   temperature=float(sampling_params.get("temperature", 1.0)),
                   max_turns=int(os.environ.get("GLM5_SLIME_MAX_TURNS", "30")), concurrency=1,
                   seed=int(getattr(args, "seed", 0) or 0))  # fmt: skip
    cache = Path(os.environ.get("GLM5_SLIME_CACHE", Path(tempfile.gettempdir()) / "glm5-slime-cache"))
    env = BenchEnv(ref["env"], max_turns=cfg.max_turns, cache_dir=cache,
                   profile=os.environ.get("GLM5_SLIME_PROFILE") or None)  # fmt: skip
    work = Path(os.environ.get("GLM5_SLIME_WORKDIR", Path(tempfile.gettempdir()) / "glm5-slime")) / session
    limit = getattr(args, "rollout_max_context_len", None)
    orch = Orchestrator(env, [task], server, _tokenizer(args.hf_checkpoint), cfg, work, lambda r: None,
                        max_model_len=int(limit) if limit else None)  # fmt: skip
    try:
        rollout = orch.run_session(0, sample.index or 0)
    finally:
        orch.close()
        server.close()
    return slime_samples(sample, rollout, sample_type)
