"""What both engine launchers share: the server-level options, the built command, and the install check."""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from serve.http.settings import check_api_key

# GLM-5's parsers in both engines (sglang `Glm47MoeDetector`, "for GLM-4.7 and GLM-5"; vLLM `glm47_moe`).
TOOL_CALL_PARSER = "glm47"
REASONING_PARSER = "glm45"


def socket_env(nnodes: int, ifname: str | None) -> dict[str, str]:
    """The network interface a multi-node launch talks over (the vLLM recipes' multi-node strategies set both)."""
    return {"GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname} if nnodes > 1 and ifname else {}


def console_script(name: str, *sub: str) -> tuple[str, ...]:
    """An engine's console script beside this interpreter, else on PATH, else the name alone."""
    beside = Path(sys.executable).with_name(name)
    return (str(beside) if beside.exists() else shutil.which(name) or name, *sub)


@dataclass(frozen=True)
class ServerOptions:
    """Options that are the same whichever engine runs: where it listens and what it calls itself."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    max_num_seqs: int | None = None
    mem_fraction: float | None = None  # None: the recipe's for the hardware (0.85; B200 0.9, AMD 0.80)
    extra_args: tuple[str, ...] = ()
    socket_ifname: str | None = None  # multi-node: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (the interface to use)
    rollout_lora_rank: int | None = None  # an RL rollout server (sglang): adapters up to this rank loaded at run time
    rollout_lora_targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_api_key(self.api_key)  # sglang and vLLM, too, read an empty key as none


def parser_flags() -> list[str]:
    """GLM-5's tool-call and reasoning parsers, spelt the same in both engines."""
    return ["--tool-call-parser", TOOL_CALL_PARSER, "--reasoning-parser", REASONING_PARSER]


def server_flags(opts: ServerOptions, max_seqs_flag: str) -> list[str]:
    """The served name, the API key and the bound on running requests (`max_seqs_flag`: each engine's spelling)."""
    argv = []
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name]
    if opts.api_key:
        argv += ["--api-key", opts.api_key]
    if opts.max_num_seqs:
        argv += [max_seqs_flag, str(opts.max_num_seqs)]
    return argv


@dataclass(frozen=True)
class EngineCommand:
    """An argv plus the environment it needs; `display()` is what we print (API key masked)."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    serves_http: bool = True  # False on the worker nodes of a multi-node launch (no API there)

    def display(self) -> str:
        argv = list(self.argv)
        for i, arg in enumerate(argv[:-1]):
            if arg == "--api-key":
                argv[i + 1] = "***"
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + shlex.join(argv)


class EngineNotInstalled(RuntimeError):
    """The engine's Python package is missing; the message says how to install it."""


def require_installed(package: str, extra: str) -> None:
    """Raise EngineNotInstalled unless `package` can be imported. Looks it up without importing it."""
    if importlib.util.find_spec(package) is None:
        raise EngineNotInstalled(
            f'{package} is not installed in this Python environment. Install it with: pip install "glm5[{extra}]" '
            f"(it needs CUDA GPUs; see the {package} documentation for your platform)"
        )
