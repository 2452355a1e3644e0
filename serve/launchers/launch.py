"""`glm5 serve --engine sglang|vllm` as functions: the launch (topology checked, each node's command built) and its
run (the child process, its /health, its log). The CLI resolves the options and prints; this knows no terminal.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace

from serve.launchers.common import EngineCommand, ServerOptions, require_installed
from serve.launchers.process import ExternalServer
from serve.launchers.sglang import sglang_command
from serve.launchers.topology import Topology, checkpoint_bytes
from serve.launchers.vllm import vllm_command

# Memory per GPU by `--hardware` when `--gpu-memory-gib` is not given (H200: 141 GB; AMD: MI300X's 192).
GPU_MEMORY_GIB = {"h100": 80.0, "b200": 180.0, "amd": 192.0}
DEFAULT_GPU_MEMORY_GIB = 141.0

_BUILDERS = {"sglang": sglang_command, "vllm": vllm_command}


@dataclass(frozen=True)
class Launch:
    """One external engine over a checked topology: `command()` is this node's argv, `node_commands()` every node's."""

    engine: str  # "sglang" | "vllm"
    topology: Topology
    options: ServerOptions
    program: tuple[str, ...] | None = None  # run instead of the engine's own entry point

    def command(self, node_rank: int | None = None) -> EngineCommand:
        topo = self.topology if node_rank is None else replace(self.topology, node_rank=node_rank)
        return _BUILDERS[self.engine](topo, self.options, self.program)

    def node_commands(self) -> list[EngineCommand]:
        """One command per node, rank order, so a whole multi-node launch can be read (or put in a job script)."""
        return [self.command(rank) for rank in range(self.topology.nnodes)]

    def check_installed(self) -> None:
        """Raise EngineNotInstalled when the engine is missing (a `program` of the caller's own is not checked)."""
        if self.program is None:
            require_installed(self.engine, self.engine)


def plan_launch(
    engine: str, topology: Topology, options: ServerOptions, gpu_memory_gib: float | None, engine_program: str | None
) -> Launch:
    """Validate `topology`, check the checkpoint's weights fit its GPUs, and build this node's command once (so a
    flag the engine cannot take is refused now). Raises TopologyError."""
    topo = topology.validate()
    memory = gpu_memory_gib or GPU_MEMORY_GIB.get(topo.hardware, DEFAULT_GPU_MEMORY_GIB)
    topo.check_fits(checkpoint_bytes(options.model), memory)
    program = tuple(shlex.split(engine_program)) if engine_program else None
    launch = Launch(engine, topo, options, program)
    launch.command()
    return launch


def run_launch(launch: Launch, log: Callable[[str], None], on_ready: Callable[[], None]) -> int:
    """Run this node's engine until it exits; `on_ready` once its /health answers. Returns its exit code."""
    opts = launch.options
    health_host = "127.0.0.1" if opts.host in ("0.0.0.0", "::") else opts.host
    server = ExternalServer(
        launch.command(),
        health_url=f"http://{health_host}:{opts.port}/health",
        health_headers={"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else None,
        log=log,
        on_ready=on_ready,
    )
    return server.run()
