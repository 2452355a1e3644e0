"""sglang / vLLM commands for representative GLM-5 topologies, and the launch lifecycle with a stand-in engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from serve.launchers.common import EngineCommand, EngineNotInstalled, ServerOptions, require_installed
from serve.launchers.process import ExternalServer
from serve.launchers.sglang import sglang_command
from serve.launchers.topology import Topology, TopologyError, checkpoint_bytes, checkpoint_precision
from serve.launchers.vllm import vllm_command

STANDIN = Path(__file__).parent / "standins" / "engine_server.py"
PROG_SGL = ("sglang", "serve")
PROG_VLLM = ("vllm", "serve")


def flags(argv) -> dict[str, str | None]:
    """--flag value pairs (None for bare switches)."""
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or nxt.startswith("--"):
                out[argv[i]] = None
                i += 1
            else:
                out[argv[i]] = nxt
                i += 2
        else:
            i += 1
    return out


def test_vllm_one_node_fp8_is_the_readme_recipe():
    opts = ServerOptions(model="zai-org/GLM-5-FP8", served_model_name="glm-5-fp8")
    cmd = vllm_command(Topology(spec_steps=1, spec_draft_tokens=2).validate(), opts, PROG_VLLM)
    f = flags(cmd.argv)
    assert cmd.argv[:3] == ("vllm", "serve", "zai-org/GLM-5-FP8")
    assert f["--tensor-parallel-size"] == "8" and f["--gpu-memory-utilization"] == "0.85"
    assert f["--speculative-config.method"] == "mtp" and f["--speculative-config.num_speculative_tokens"] == "1"
    assert f["--tool-call-parser"] == "glm47" and f["--reasoning-parser"] == "glm45"
    assert "--enable-auto-tool-choice" in f and f["--served-model-name"] == "glm-5-fp8"
    assert "--data-parallel-size" not in f and "--nnodes" not in f


@pytest.mark.parametrize("rank", [0, 1])
def test_two_nodes_bf16(rank):
    topo = Topology(nnodes=2, node_rank=rank, dist_init_addr="10.0.0.1:20000", precision="bf16").validate()
    topo.check_fits(checkpoint_bytes("zai-org/GLM-5"), gpu_memory_gib=141)  # 16 x H200 hold BF16
    opts = ServerOptions(model="zai-org/GLM-5", host="0.0.0.0")
    s = flags(sglang_command(topo, opts, PROG_SGL).argv)
    assert s["--tp-size"] == "16" and s["--nnodes"] == "2" and s["--node-rank"] == str(rank)
    assert s["--dist-init-addr"] == "10.0.0.1:20000"
    vcmd = vllm_command(topo, opts, PROG_VLLM)
    v = flags(vcmd.argv)
    assert v["--tensor-parallel-size"] == "16" and v["--nnodes"] == "2" and v["--node-rank"] == str(rank)
    assert v["--master-addr"] == "10.0.0.1" and v["--master-port"] == "20000"
    assert ("--headless" in v) == (rank == 1)
    assert vcmd.serves_http == (rank == 0)


def test_bf16_on_one_node_of_h200_does_not_fit():
    with pytest.raises(TopologyError, match="need at least 13 GPUs"):
        Topology(precision="bf16").check_fits(checkpoint_bytes("zai-org/GLM-5"), gpu_memory_gib=141)
    Topology(precision="fp8").check_fits(checkpoint_bytes("zai-org/GLM-5-FP8"), gpu_memory_gib=141)
    with pytest.raises(TopologyError):  # H100 80 GB: FP8 needs two nodes (the cookbook's tp=16)
        Topology(precision="fp8").check_fits(checkpoint_bytes("zai-org/GLM-5-FP8"), gpu_memory_gib=80)


def test_dp_attention_and_expert_parallel():
    topo = Topology(dp=8, dp_attention=True, ep=8).validate()
    opts = ServerOptions(model="m")
    s = flags(sglang_command(topo, opts, PROG_SGL).argv)
    assert s["--tp-size"] == "8" and s["--attn-dp-size"] == "8" and s["--ep-size"] == "8"
    assert "--dp-size" not in s  # sglang 0.5.23: --attn-dp-size replaces --dp-size N --enable-dp-attention
    v = flags(vllm_command(topo, opts, PROG_VLLM).argv)  # vLLM multiplies TP by DP: attention DP 8 = TP 1 x DP 8
    assert v["--tensor-parallel-size"] == "1" and v["--data-parallel-size"] == "8"
    assert "--enable-expert-parallel" in v


def test_multinode_vllm_data_parallel_spreads_ranks():
    topo = Topology(nnodes=2, node_rank=1, dist_init_addr="h0:13345", dp=16, dp_attention=True).validate()
    v = flags(vllm_command(topo, ServerOptions(model="m"), PROG_VLLM).argv)
    assert v["--data-parallel-size"] == "16" and v["--data-parallel-size-local"] == "8"
    assert v["--data-parallel-start-rank"] == "8" and v["--data-parallel-address"] == "h0"
    assert "--headless" in v


def test_speculation_off_and_options():
    topo = Topology(speculative=None).validate()
    opts = ServerOptions(model="m", api_key="sekret", max_num_seqs=32, extra_args=("--chunked-prefill-size", "4096"))
    cmd = sglang_command(topo, opts, PROG_SGL)
    s = flags(cmd.argv)
    assert "--speculative-algorithm" not in s and cmd.env == {}
    assert s["--max-running-requests"] == "32" and s["--chunked-prefill-size"] == "4096"
    assert "sekret" not in cmd.display() and "--api-key '***'" in cmd.display()
    assert flags(vllm_command(topo, opts, PROG_VLLM).argv)["--max-num-seqs"] == "32"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(nnodes=2), "--dist-init-addr"),
        (dict(nnodes=2, node_rank=2, dist_init_addr="h:1"), "--node-rank 2"),
        (dict(tp=4), "uses 4 GPUs"),
        (dict(dp=3, dp_attention=True, gpus_per_node=8), "--dp-attention"),
        (dict(ep=3), "--ep 3"),
        (dict(speculative="ngram"), "ngram"),
        (dict(precision="int8"), "int8"),
    ],
)
def test_bad_topologies_name_the_flag(kwargs, message):
    with pytest.raises(TopologyError, match=message):
        Topology(**kwargs).validate()


def test_precision_and_size_from_checkpoint_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1234}}))
    assert checkpoint_precision(str(tmp_path)) == "fp8" and checkpoint_bytes(str(tmp_path)) == 1234
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_precision(str(tmp_path)) == "bf16"
    assert checkpoint_precision("zai-org/GLM-5-FP8") == "fp8" and checkpoint_precision("zai-org/GLM-5") == "bf16"


def test_missing_engine_says_how_to_install():
    with pytest.raises(EngineNotInstalled, match=r'pip install "glm5\[sglang\]"'):
        require_installed("sglang_surely_not_installed_pkg", "sglang")
    assert "sglang" not in sys.modules  # never imported, only looked up


def standin(port: int, **env) -> EngineCommand:
    argv = (sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", str(port), "--tp-size", "8")
    return EngineCommand(argv, {k: str(v) for k, v in env.items()})


def test_lifecycle_ready_then_sigterm_is_forwarded(free_port):
    lines: list[str] = []
    server = ExternalServer(
        standin(free_port, STANDIN_READY_AFTER=0.6),
        f"http://127.0.0.1:{free_port}/health",
        log=lines.append,
        poll_interval=0.1,
    )
    became_ready = []

    def on_ready():
        became_ready.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)  # as if the user stopped `glm5 serve`: it must reach the engine

    server.on_ready = on_ready
    t0 = time.monotonic()
    code = server.run()
    assert code == 0
    assert became_ready and became_ready[0] - t0 >= 0.5  # waited through the 503s
    assert any("standin argv:" in line and "--tp-size 8" in line for line in lines)  # its log reached ours
    assert "standin got SIGTERM" in lines and "standin exiting" in lines
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_lifecycle_crash_exit_code_is_returned(free_port):
    lines: list[str] = []
    server = ExternalServer(
        standin(free_port, STANDIN_READY_AFTER=100, STANDIN_CRASH_AFTER=0.5),
        f"http://127.0.0.1:{free_port}/health",
        log=lines.append,
        poll_interval=0.1,
    )
    assert server.run() == 3
    assert not server.ready.is_set() and "standin crashing" in lines


def test_lifecycle_startup_timeout_stops_the_engine(free_port):
    lines: list[str] = []
    server = ExternalServer(
        standin(free_port, STANDIN_READY_AFTER=100, STANDIN_EXIT_CODE=7),
        f"http://127.0.0.1:{free_port}/health",
        log=lines.append,
        poll_interval=0.1,
        startup_timeout=0.5,
    )
    assert server.run() == 7
    assert any("not healthy after" in line for line in lines) and "standin got SIGTERM" in lines


def test_lifecycle_kills_an_engine_that_ignores_signals(free_port, tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    )
    server = ExternalServer(EngineCommand((sys.executable, str(script))), None, log=lambda s: None, grace_period=0.3)
    threading.Timer(0.5, server.stop).start()
    assert server.run() == 128 + signal.SIGKILL


def test_cli_dry_run_prints_the_command():
    from typer.testing import CliRunner

    from glm5cli.app import app

    args = ["serve", "zai-org/GLM-5", "--engine", "sglang", "--dry-run", "--nnodes", "2", "--node-rank", "0"]
    result = CliRunner().invoke(app, [*args, "--dist-init-addr", "10.0.0.1:20000", "--served-model-name", "glm-5"])
    assert result.exit_code == 0, result.output
    assert "sglang serve --model-path zai-org/GLM-5" in result.output and "--tp-size 16" in result.output
    bad = CliRunner().invoke(app, ["serve", "zai-org/GLM-5", "--engine", "vllm", "--dry-run"])
    assert bad.exit_code == 2 and "need at least" in bad.output


def test_cli_without_the_package_says_how_to_install():
    from typer.testing import CliRunner

    from glm5cli.app import app

    result = CliRunner().invoke(app, ["serve", "zai-org/GLM-5-FP8", "--engine", "sglang"])
    if "sglang" in {m.name for m in __import__("pkgutil").iter_modules()}:
        pytest.skip("sglang is installed here")
    assert result.exit_code == 1 and 'pip install "glm5[sglang]"' in " ".join(result.output.split())


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_cli_launches_runs_and_forwards_ctrl_c(free_port, engine):
    """The whole `glm5 serve --engine ...` process: prints its command, streams the log, waits, forwards SIGINT."""
    program = f"{sys.executable} {STANDIN}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "glm5cli",
            "serve",
            "zai-org/GLM-5-FP8",
            "--engine",
            engine,
            "--port",
            str(free_port),
            "--engine-program",
            program,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "STANDIN_READY_AFTER": "0.3", "COLUMNS": "400"},
    )
    seen = []
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        seen.append(line)
        if "ready" in line and "http://" in line:
            proc.send_signal(signal.SIGINT)
        if time.monotonic() > deadline:
            proc.kill()
            break
    assert proc.wait(timeout=10) == 0, "".join(seen)
    text = "".join(seen)
    assert "--tool-call-parser glm47" in text  # the command it ran was printed
    assert f"{engine}| standin got SIGINT" in text
    if engine == "sglang":
        assert "SGLANG_ENABLE_SPEC_V2=1" in text and "--speculative-algorithm EAGLE" in text
    else:
        assert "--speculative-config.method mtp" in text and "--enable-auto-tool-choice" in text


def test_cli_dry_run_prints_every_node_of_a_multinode_launch():
    from typer.testing import CliRunner

    from glm5cli.app import app

    args = ["serve", "zai-org/GLM-5", "--engine", "vllm", "--dry-run", "--nnodes", "2", "--dist-init-addr", "h0:5000"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "# node 0" and lines[2] == "# node 1"
    assert "--node-rank 0" in lines[1] and "--headless" not in lines[1]
    assert "--node-rank 1" in lines[3] and lines[3].endswith("--headless")
