"""finetune/slime: slime's custom generate-function hook run as slime runs it (awaited, with slime's Sample type
written from its documented fields, slime/utils/types.py) against `glm5 serve` on `tiny` standing in for slime's
sglang router: a glm5 agent session on a built-in SWE task, graded by the bench; the Samples' tokens are the TITO
record's, the masks count the sampled tokens, every segment shares the rollout id, the reward is the grade."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from dataclasses import dataclass, field
from enum import Enum

import pytest
from rich.console import Console

import finetune.slime.generate as gen
from finetune.slime.tasks import TASK_KEY, prompt_rows, write_prompt_data
from plugins.bench_suites.swe_suite import SWESuite
from serve.http.app import create_app
from serve.http.server import load_engine
from serve.http.settings import ServerSettings
from tests.serve.conftest import tiny_checkpoint  # noqa: F401 (a fixture)
from tests.serve.server_thread import ServerThread


@dataclass
class Sample:
    """slime.utils.types.Sample's fields that the hook reads or writes (slime 624b824a8)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    session_id: str | None = None


@pytest.fixture
def router(tiny_checkpoint):  # noqa: F811
    engine, tok = load_engine(tiny_checkpoint, None, False, 8, 4096, Console(quiet=True), kv_cache_gib=0.05)
    with ServerThread(create_app(engine, tok, ServerSettings("tiny"))) as s:
        s.wait_healthy()
        yield s
    engine.shutdown()


def test_the_hook_runs_a_bench_session_and_returns_slimes_samples(router, tiny_checkpoint, tmp_path, monkeypatch):  # noqa: F811
    [jsonl] = SWESuite().materialize(tmp_path / "suite")
    rows = prompt_rows("swe", jsonl, [])
    write_prompt_data(rows, tmp_path / "prompts.jsonl")  # what slime's --prompt-data reads
    row = json.loads((tmp_path / "prompts.jsonl").read_text().splitlines()[0])
    assert row["metadata"][TASK_KEY]["id"] == row["label"]
    for mod in ("slime", "slime.utils"):
        monkeypatch.setitem(sys.modules, mod, types.ModuleType(mod))
    monkeypatch.setitem(sys.modules, "slime.utils.types", types.SimpleNamespace(Sample=Sample))
    monkeypatch.setenv("GLM5_SLIME_MAX_TURNS", "2")
    monkeypatch.setenv("GLM5_SLIME_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("GLM5_SLIME_CACHE", str(tmp_path / "cache"))
    seen, real = [], gen.slime_samples
    monkeypatch.setattr(gen, "slime_samples", lambda base, r, t: seen.append(r) or real(base, r, t))  # the Rollout
    args = types.SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=router.port,
                                 hf_checkpoint=str(tiny_checkpoint), seed=0, rollout_max_context_len=4096)  # fmt: skip
    base = Sample(group_index=1, index=5, prompt=row["prompt"], label=row["label"], metadata=row["metadata"])
    out = asyncio.run(gen.generate(args, base, {"max_new_tokens": 8, "temperature": 1.0}))

    [rollout] = seen
    assert rollout.status == "ok" and rollout.calls, rollout.error
    assert out and all(isinstance(s, Sample) for s in out)
    for b, s in enumerate(out):
        calls = [c for c in rollout.calls if c.branch == b]
        assert s.rollout_id == 5 and s.session_id == base.session_id  # one id over the session's segments
        assert s.reward == rollout.reward == 0.0 and s.metadata["glm5"]["solved"] is False  # the bench's grade
        assert s.status is Sample.Status.COMPLETED and not s.remove_sample
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length <= len(s.tokens)
        sampled = [t for t, m in zip(s.tokens[-s.response_length :], s.loss_mask, strict=True) if m]
        assert sampled == [t for c in calls for t in c.output_ids]  # exactly the ids the router sampled
        assert sum(s.loss_mask) == sum(len(c.output_ids) for c in calls)
        assert [lp for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if m] == pytest.approx(
            [x for c in calls for x in c.logprobs]
        )
        assert s.weight_versions and all(v.isdigit() for v in s.weight_versions)
    assert out[0].tokens[: rollout.calls[0].offset] == rollout.calls[0].prompt_ids  # the prompt as the router saw it


def test_a_row_without_a_task_is_refused_with_the_command_that_writes_one():
    args = types.SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=1, hf_checkpoint=".")
    with pytest.raises(ValueError, match="--trainer slime"):
        gen.run_session(args, Sample(index=0, metadata={}), {}, Sample)


def test_a_routed_server_names_the_session_in_every_request():
    s = gen.RoutedServer("http://127.0.0.1:1", "glm5-1-2-abc")
    assert s._http.headers[gen.ROUTING_HEADER] == "glm5-1-2-abc"
    s.close()


def test_finetune_rl_trainer_slime_writes_prompt_data_and_a_launch_script(tiny_checkpoint, tmp_path):  # noqa: F811
    import subprocess

    from typer.testing import CliRunner

    from glm5cli.app import app

    [jsonl] = SWESuite().materialize(tmp_path / "suite")
    out = tmp_path / "slime-run"
    r = CliRunner().invoke(app, ["finetune", "rl", str(tiny_checkpoint), "--env", "swe", "--tasks", str(jsonl),
                                 "--trainer", "slime", "--out", str(out), "--group-size", "4", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert rows and all(row["metadata"][TASK_KEY]["env"] == "swe" for row in rows)
    script = (out / "run-glm5-slime.sh").read_text()
    for flag in ("--custom-generate-function-path finetune.slime.generate.generate", "--n-samples-per-prompt 4",
                 "--router-policy consistent_hashing", "--metadata-key metadata", str(out.resolve() / "prompts.jsonl"),
                 "glm5-744B-A40B.sh", "--expert-model-parallel-size 32"):  # fmt: skip
        assert flag in script, flag
    assert subprocess.run(["bash", "-n", str(out / "run-glm5-slime.sh")]).returncode == 0
    again = CliRunner().invoke(app, ["finetune", "rl", str(tiny_checkpoint), "--env", "completion", "--tasks",
                                     str(jsonl), "--trainer", "slime", "--out", str(tmp_path / "o2")])  # fmt: skip
    assert again.exit_code == 2 and "--env swe" in again.output


def test_sft_export_gives_slime_the_ids_and_masks_glm5s_sft_trains_on(tiny_checkpoint, tmp_path):  # noqa: F811
    from typer.testing import CliRunner

    from finetune.data.trajectories import DataOptions
    from finetune.loading import load_data
    from finetune.slime.sft import generate_rollout
    from glm5cli.app import app
    from serve.engine.llm import load_tokenizer
    from tests.glm5cli.test_finetune_sft import _sessions

    _sessions(tmp_path / "sessions")
    out = tmp_path / "export"
    r = CliRunner().invoke(app, ["finetune", "sft", str(tiny_checkpoint), "--data", str(tmp_path / "sessions"),
                                 "--out", str(out), "--export-slime"])  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (out / "sft.jsonl").read_text().splitlines()]
    want, _ = load_data([tmp_path / "sessions"], load_tokenizer(tiny_checkpoint), DataOptions(max_len=2048))
    assert len(rows) == len(want) == 3

    class Buffer:  # slime's data source: get_samples(n) -> groups of one Sample each, as slime's Dataset made them
        def get_samples(self, n):
            return [[Sample(prompt=row["prompt"], metadata=row["metadata"])] for row in rows[:n]]

    groups = generate_rollout(types.SimpleNamespace(rollout_batch_size=3), 0, Buffer())
    for [s], (ids, mask) in zip(groups, want, strict=True):
        assert s.tokens == ids
        assert s.loss_mask == [int(m) for m in mask[-s.response_length :]] and s.loss_mask[0] == 1
        assert sum(s.loss_mask) == sum(mask)  # every target of glm5's SFT, none more


def test_the_hook_runs_the_agent_profile_the_launch_names(tmp_path, monkeypatch):
    """GLM5_SLIME_PROFILE (written into the launch's runtime env) chooses the sessions' agent profile; a name that is
    not a profile is refused before any session starts."""
    from finetune.rl.bench_env import BenchEnv, BenchSession, RLBenchAgent
    from finetune.slime.launch import SlimeRun, launch_script

    script = launch_script(SlimeRun(prompts=tmp_path / "p.jsonl", profile="compact"), tmp_path, tmp_path / "ckpt")
    assert '\\"GLM5_SLIME_PROFILE\\": \\"${GLM5_SLIME_PROFILE:-compact}\\"' in script
    env = BenchEnv("swe", max_turns=2, cache_dir=tmp_path / "cache", profile="compact")
    made = []
    monkeypatch.setattr("finetune.rl.bench_env.run_trial", lambda task, agent, *a: made.append(agent))
    BenchSession(env, None, tmp_path / "w").run(model=object())
    [agent] = made
    assert isinstance(agent, RLBenchAgent) and agent.profile == "compact"
    assert BenchEnv("swe", cache_dir=tmp_path / "cache").profile is None  # the config's, else full
    with pytest.raises(ValueError, match="not one of full, compact"):
        BenchEnv("swe", cache_dir=tmp_path / "cache", profile="tiny")


def test_finetune_rl_agent_profile_reaches_slimes_launch_and_glm5s_bench_env(tiny_checkpoint, tmp_path):  # noqa: F811
    """`--agent-profile compact`: the slime launch's sessions run it (GLM5_SLIME_PROFILE) and so does glm5's own
    agentic RL (its BenchEnv); a name that is not a profile, or an env without agent sessions, is a usage error."""
    from typer.testing import CliRunner

    from finetune.rl.config import RLConfig
    from finetune.rl.job import environment
    from glm5cli.app import app

    [jsonl] = SWESuite().materialize(tmp_path / "suite")
    base = ["finetune", "rl", str(tiny_checkpoint), "--env", "swe", "--tasks", str(jsonl)]
    r = CliRunner().invoke(app, [*base, "--trainer", "slime", "--out", str(tmp_path / "s"), "--agent-profile",
                                 "compact"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert '\\"GLM5_SLIME_PROFILE\\": \\"${GLM5_SLIME_PROFILE:-compact}\\"' in (tmp_path / "s/run-glm5-slime.sh").read_text()
    bench, tasks, _ = environment("swe", jsonl, [], RLConfig(), None, "compact")
    assert bench.profile == "compact" and tasks
    for bad in (["--agent-profile", "tiny"], ["--agent-profile", "compact", "--env", "scripted"]):
        r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "b"), *bad])
        assert r.exit_code == 2 and "--agent-profile" in r.output, r.output
