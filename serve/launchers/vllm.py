"""The vLLM command line for GLM-5: `vllm serve MODEL` with the recipe's flags.

From vllm-project/recipes `GLM/GLM5.md`, `models/zai-org/GLM-5.yaml` (base_args `--trust-remote-code
--chat-template-content-format=string`) and `strategies/multi_node_*.yaml`, zai-org/GLM-5's README and vLLM's docs
(reference/serving-and-benchmarks.md A2); every argv here is parsed by vLLM 0.34's own `vllm serve` parser
(tests/serve/test_engine_contracts.py). vLLM multiplies
`--tensor-parallel-size` by `--data-parallel-size`, so sglang-style dp-attention (attention DP inside one TP group,
experts sharded) becomes TP = tp/dp, DP = dp with `--enable-expert-parallel`. MTP is
`--speculative-config.method mtp` with as many speculative tokens as sglang's EAGLE steps. Multi-node: plain TP
uses the multiprocessing backend's `--nnodes --node-rank --master-addr --master-port`; DP spreads ranks with
`--data-parallel-size-local --data-parallel-address --data-parallel-rpc-port --data-parallel-start-rank` with
`--data-parallel-hybrid-lb` (the recipes' multi_node_dep). Nodes other than 0 run `--headless` (no API server).
Multi-node launches set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to `--socket-ifname` when given.
"""

from __future__ import annotations

from serve.launchers.common import EngineCommand, ServerOptions, console_script, parser_flags, server_flags, socket_env
from serve.launchers.topology import Topology, TopologyError


def default_program() -> tuple[str, ...]:
    """The `vllm` console script beside this interpreter, else on PATH, else the name alone."""
    return console_script("vllm", "serve")


def vllm_command(topo: Topology, opts: ServerOptions, program: tuple[str, ...] | None = None) -> EngineCommand:
    """The argv and environment that start vLLM for `topo` (validated first)."""
    topo.validate()
    if opts.rollout_lora_rank is not None:
        raise TopologyError("an RL rollout server is sglang (glm5's RL client speaks sglang's /generate and adapter "
                            "routes): use --engine sglang")  # fmt: skip
    if topo.dp_attention:
        tp, dp = topo.tp_size // topo.dp, topo.dp
    else:
        tp, dp = topo.tp_size, topo.dp
    argv = list(program or default_program())
    argv += [opts.model, "--host", opts.host, "--port", str(opts.port)]
    argv += ["--tensor-parallel-size", str(tp)]
    if dp > 1:
        argv += ["--data-parallel-size", str(dp)]
    if topo.dp_attention or topo.ep > 1:
        argv += ["--enable-expert-parallel"]
    argv += parser_flags()
    argv += ["--enable-auto-tool-choice", "--trust-remote-code", "--chat-template-content-format", "string"]
    if topo.speculative == "mtp":
        argv += ["--speculative-config.method", "mtp"]
        argv += ["--speculative-config.num_speculative_tokens", str(topo.spec_steps)]
    mem = 0.85 if opts.mem_fraction is None else opts.mem_fraction
    argv += ["--gpu-memory-utilization", f"{mem:g}"]
    argv += server_flags(opts, "--max-num-seqs")
    if topo.nnodes > 1:
        if dp > 1:
            if dp % topo.nnodes:
                raise TopologyError(
                    f"vLLM spreads data-parallel ranks evenly: dp={dp} must divide by {topo.nnodes} nodes"
                )
            local = dp // topo.nnodes
            argv += ["--data-parallel-size-local", str(local), "--data-parallel-address", topo.master_host]
            argv += ["--data-parallel-rpc-port", str(topo.master_port)]
            argv += ["--data-parallel-start-rank", str(topo.node_rank * local), "--data-parallel-hybrid-lb"]
        else:
            argv += ["--nnodes", str(topo.nnodes), "--node-rank", str(topo.node_rank)]
            argv += ["--master-addr", topo.master_host, "--master-port", str(topo.master_port)]
        if topo.node_rank > 0:
            argv += ["--headless"]
    argv += list(opts.extra_args)
    return EngineCommand(tuple(argv), socket_env(topo.nnodes, opts.socket_ifname), serves_http=topo.node_rank == 0)
