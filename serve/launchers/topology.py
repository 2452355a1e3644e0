"""Topology: how many nodes and GPUs an external engine gets, and how GLM-5 is spread over them.

One description serves both engines; sglang.py and vllm.py translate it into each engine's flags, because the two
spell the same layout differently (sglang counts `--tp-size` over all GPUs and puts dp-attention *inside* the TP
group; vLLM multiplies TP by DP). This file knows nothing of either engine's flags.

Sizes come from the official recipes (reference/glm5-model.md §7): GLM-5-FP8 fits tp=8 on 141 GB H200s, BF16 needs
twice the GPUs. We check the weights fit rather than hard-coding GPU counts, so a small GLM-5-shaped checkpoint can
be served by sglang on one GPU too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# Weight bytes of the released checkpoints (744B parameters; FP8 stores most weights in 1 byte, BF16 in 2).
# Used when MODEL is a hub id rather than a local directory whose index tells us the size.
KNOWN_CHECKPOINT_BYTES = {"glm-5-fp8": 756e9, "glm-5": 1.51e12, "glm-5.1-fp8": 756e9, "glm-5.1": 1.51e12}

# Share of GPU memory the weights may take; the rest is KV cache and activations (the recipes use 0.85 for
# weights + KV together, so weights alone must stay well below that).
WEIGHT_SHARE = 0.80


# The GPUs the GLM-5 recipes name: NVIDIA Hopper (h100, h200), Blackwell (b200), AMD Instinct (amd: MI300X/MI325X/MI355X).
HARDWARE = ("h200", "h100", "b200", "amd")


class TopologyError(ValueError):
    """A topology that cannot work; the message says which flag to change."""


@dataclass(frozen=True)
class Topology:
    """Nodes x GPUs and the parallel layout over them.

    `tp` defaults to every GPU of every node (one model replica, the recipes' layout). With `dp_attention`, attention
    runs data-parallel `dp` ways inside that TP group (sglang's meaning) and the GPUs are still `tp`; without it,
    `dp` > 1 means `dp` whole replicas of `tp` GPUs each.
    """

    nnodes: int = 1
    gpus_per_node: int = 8
    node_rank: int = 0
    dist_init_addr: str | None = None  # "host:port" of node 0, required with nnodes > 1
    tp: int | None = None
    dp: int = 1
    ep: int = 1
    dp_attention: bool = False
    precision: str = "fp8"  # "fp8" | "bf16" | "int4" (compressed-tensors W4A16, `glm5 model quantize`): the weights
    speculative: str | None = "mtp"  # GLM-5's MTP layer as the draft (EAGLE in sglang); None turns it off
    spec_steps: int = 3
    spec_topk: int = 1
    spec_draft_tokens: int = 4
    hardware: str = "h200"  # h200 | h100 | b200 | amd: the recipes' per-hardware backends (sglang.py)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def tp_size(self) -> int:
        if self.tp is not None:
            return self.tp
        return self.world_size if self.dp_attention or self.dp == 1 else self.world_size // self.dp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp_size

    @property
    def master_host(self) -> str:
        return (self.dist_init_addr or "127.0.0.1:20000").rsplit(":", 1)[0]

    @property
    def master_port(self) -> int:
        return int((self.dist_init_addr or "127.0.0.1:20000").rsplit(":", 1)[1])

    def validate(self) -> Topology:
        """Raise TopologyError naming the flag at fault; return self so calls chain."""
        if self.nnodes < 1 or self.gpus_per_node < 1:
            raise TopologyError("--nnodes and --gpus-per-node must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise TopologyError(
                f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1} (--nnodes {self.nnodes})"
            )
        if self.nnodes > 1:
            if not self.dist_init_addr or ":" not in self.dist_init_addr:
                raise TopologyError(
                    "--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address, same on every node)"
                )
            if not self.dist_init_addr.rsplit(":", 1)[1].isdigit():
                raise TopologyError(f"--dist-init-addr {self.dist_init_addr!r}: the port must be a number")
        if self.precision not in ("fp8", "bf16", "int4"):
            raise TopologyError(f"precision {self.precision!r}: expected fp8, bf16 or int4")
        for name in ("dp", "ep"):
            if getattr(self, name) < 1:
                raise TopologyError(f"--{name} must be at least 1")
        used = self.tp_size if self.dp_attention else self.tp_size * self.dp
        if used != self.world_size:
            raise TopologyError(
                f"the layout uses {used} GPUs (tp={self.tp_size}"
                + ("" if self.dp_attention else f" x dp={self.dp}")
                + f") but {self.nnodes} node(s) x {self.gpus_per_node} GPUs = {self.world_size}"
            )
        if self.dp_attention and (self.dp < 2 or self.tp_size % self.dp):
            raise TopologyError(f"--dp-attention needs --dp >= 2 dividing tp={self.tp_size} (got dp={self.dp})")
        if self.ep > 1 and self.tp_size % self.ep:
            raise TopologyError(f"--ep {self.ep} must divide tp={self.tp_size}")
        if self.hardware not in HARDWARE:
            raise TopologyError(f"--hardware {self.hardware!r}: expected one of {', '.join(HARDWARE)}")
        if self.speculative not in (None, "mtp"):
            raise TopologyError(f"--speculative {self.speculative!r}: only 'mtp' is supported")
        if self.speculative and self.spec_topk == 1 and self.spec_draft_tokens != self.spec_steps + 1:
            raise TopologyError("with topk 1 the draft tokens must be steps + 1 (EAGLE 3/1/4 is the GLM-5 recipe)")
        return self

    def check_fits(self, weight_bytes: float | None, gpu_memory_gib: float) -> None:
        """Raise TopologyError if the weights cannot fit on one replica's GPUs (None: size unknown, no check)."""
        if weight_bytes is None:
            return
        per_gpu = weight_bytes / self.gpus_per_replica
        budget = WEIGHT_SHARE * gpu_memory_gib * 2**30
        if per_gpu > budget:
            need = math.ceil(weight_bytes / budget)
            raise TopologyError(
                f"{self.precision.upper()} weights of {weight_bytes / 1e9:.0f} GB need at least {need} GPUs of "
                f"{gpu_memory_gib:g} GiB per replica; this layout gives {self.gpus_per_replica} "
                f"(add nodes with --nnodes, or serve the FP8 checkpoint)"
            )


def default_speculative(speculative: str | None, hardware: str) -> str | None:
    """The speculative decoding an external engine runs: as asked; by default GLM-5's MTP layer, except on AMD."""
    if speculative == "off":
        return None
    return speculative or ("mtp" if hardware != "amd" else None)


def checkpoint_precision(model: str) -> str:
    """fp8 if the checkpoint is FP8, int4 if it is compressed-tensors (the W4A16 `glm5 model quantize` writes; both
    engines read it from config.json's quantization_config, no flag), else bf16; a hub id by its name."""
    config = Path(model) / "config.json"
    if config.is_file():
        quant = json.loads(config.read_text()).get("quantization_config") or {}
        method = str(quant.get("quant_method", "")).lower()
        return {"fp8": "fp8", "compressed-tensors": "int4"}.get(method, "bf16")
    return "fp8" if model.lower().rstrip("/").endswith("fp8") else "bf16"


def checkpoint_bytes(model: str) -> float | None:
    """Total weight bytes: the safetensors index's total_size, the files' sizes, or the known release sizes."""
    path = Path(model)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.is_file():
            size = json.loads(index.read_text()).get("metadata", {}).get("total_size")
            if size:
                return float(size)
        files = list(path.glob("*.safetensors"))
        return float(sum(f.stat().st_size for f in files)) if files else None
    return KNOWN_CHECKPOINT_BYTES.get(model.rstrip("/").rsplit("/", 1)[-1].lower())
