"""The sglang command line for GLM-5: `python -m sglang.launch_server` with the recipe's flags.

From zai-org/GLM-5's README and sglang's docs (reference/serving-and-benchmarks.md A1.3): `--tp-size` counts every
GPU of every node; dp-attention is `--dp-size D --enable-dp-attention` inside that TP group; MTP speculation is
EAGLE with 3 steps / top-k 1 / 4 draft tokens and wants `SGLANG_ENABLE_SPEC_V2=1`; multi-node repeats the same
command on every node with its own `--node-rank` and node 0's `--dist-init-addr`.
"""

from __future__ import annotations

import sys

from serve.launchers.common import REASONING_PARSER, TOOL_CALL_PARSER, EngineCommand, ServerOptions
from serve.launchers.topology import Topology


def sglang_command(topo: Topology, opts: ServerOptions, program: tuple[str, ...] | None = None) -> EngineCommand:
    """The argv and environment that start sglang for `topo` (validated first)."""
    topo.validate()
    argv = list(program or (sys.executable, "-m", "sglang.launch_server"))
    argv += ["--model-path", opts.model, "--host", opts.host, "--port", str(opts.port)]
    argv += ["--tp-size", str(topo.tp_size)]
    if topo.dp > 1:
        argv += ["--dp-size", str(topo.dp)]
    if topo.dp_attention:
        argv += ["--enable-dp-attention"]
    if topo.ep > 1:
        argv += ["--ep-size", str(topo.ep)]
    argv += ["--tool-call-parser", TOOL_CALL_PARSER, "--reasoning-parser", REASONING_PARSER]
    env = {}
    if topo.speculative == "mtp":
        argv += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(topo.spec_steps)]
        argv += ["--speculative-eagle-topk", str(topo.spec_topk)]
        argv += ["--speculative-num-draft-tokens", str(topo.spec_draft_tokens)]
        env["SGLANG_ENABLE_SPEC_V2"] = "1"  # the GLM-5.1 README sets it for MTP (overlap scheduler, needs topk 1)
    argv += ["--mem-fraction-static", f"{opts.mem_fraction:g}"]
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name]
    if opts.api_key:
        argv += ["--api-key", opts.api_key]
    if opts.max_num_seqs:
        argv += ["--max-running-requests", str(opts.max_num_seqs)]
    argv += ["--enable-metrics"]
    if topo.nnodes > 1:
        argv += ["--nnodes", str(topo.nnodes), "--node-rank", str(topo.node_rank)]
        argv += ["--dist-init-addr", str(topo.dist_init_addr)]
    argv += list(opts.extra_args)
    return EngineCommand(tuple(argv), env, serves_http=topo.node_rank == 0)
