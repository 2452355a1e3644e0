"""The sglang command line for GLM-5: `sglang serve` with the recipe's flags, per hardware.

Sources (each golden test in tests/serve/test_launch_recipes.py names the one it follows): sglang's GLM-5 cookbook
page (`docs_new/cookbook/autoregressive/GLM/GLM-5.mdx` and its command generator
`docs_new/src/snippets/autoregressive/glm-5-deployment.jsx`), zai-org/GLM-5's README, and sglang 0.5.23's own
argument parser (`sglang/srt/server_args.py`), which every argv here is parsed with (test_engine_contracts.py).

- `--tp-size` counts every GPU of every node; multi-node repeats the command on every node with its own
  `--node-rank` and node 0's `--dist-init-addr`.
- dp-attention is `--attn-dp-size D` inside that TP group: sglang 0.5.23 deprecates the recipes'
  `--dp-size D --enable-dp-attention` for it (to be removed after 2026-12-31).
- MTP is EAGLE with N steps, top-k 1 and N+1 draft tokens (the recipe: 3/1/4; its "balanced" strategy 1/1/2) and
  `SGLANG_ENABLE_SPEC_V2=1`. AMD runs without it (the cookbook: "EAGLE speculative decoding is not currently
  supported on AMD for GLM-5").
- H200 and B200 FP8 add FlashInfer's allreduce fusion (`--flashinfer-allreduce-fusion-backend auto`, 0.5.23's
  spelling of the recipe's `--enable-flashinfer-allreduce-fusion`); B200 FP8 the DSA / MoE backends
  (`--attention-backend dsa --dsa-{prefill,decode}-backend trtllm --moe-runner-backend flashinfer_trtllm
  --quantization fp8`); AMD the tilelang DSA backends, `--chunked-prefill-size 131072 --watchdog-timeout 1200`.
- An RL rollout server (`ServerOptions.rollout_lora_rank`) adds `--enable-lora --max-lora-rank R
  --lora-target-modules ...` (sglang_for_rl.md; the trainer loads its adapter at run time) and needs dp 1: sglang
  loads adapters at run time only without data-parallel replicas.
"""

from __future__ import annotations

from serve.launchers.common import EngineCommand, ServerOptions, console_script, parser_flags, server_flags, socket_env
from serve.launchers.topology import Topology, TopologyError

MEM_FRACTION = {"b200": 0.9, "amd": 0.80}  # the cookbook's per hardware; 0.85 elsewhere


def sglang_command(topo: Topology, opts: ServerOptions, program: tuple[str, ...] | None = None) -> EngineCommand:
    """The argv and environment that start sglang for `topo` (validated first)."""
    topo.validate()
    argv = list(program or console_script("sglang", "serve"))
    argv += ["--model-path", opts.model, "--host", opts.host, "--port", str(opts.port)]
    argv += ["--tp-size", str(topo.tp_size)]
    if topo.dp_attention:
        argv += ["--attn-dp-size", str(topo.dp)]
    elif topo.dp > 1:
        argv += ["--dp-size", str(topo.dp)]
    if topo.ep > 1:
        argv += ["--ep-size", str(topo.ep)]
    argv += parser_flags()
    env = socket_env(topo.nnodes, opts.socket_ifname)
    if topo.speculative == "mtp":
        if topo.hardware == "amd":
            raise TopologyError("MTP (EAGLE) is not supported on AMD for GLM-5 in sglang: add --speculative off")
        argv += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(topo.spec_steps)]
        argv += ["--speculative-eagle-topk", str(topo.spec_topk)]
        argv += ["--speculative-num-draft-tokens", str(topo.spec_draft_tokens)]
        env["SGLANG_ENABLE_SPEC_V2"] = "1"  # the GLM-5.1 README sets it for MTP (overlap scheduler, needs topk 1)
    argv += _hardware_flags(topo)
    mem = opts.mem_fraction if opts.mem_fraction is not None else MEM_FRACTION.get(topo.hardware, 0.85)
    argv += ["--mem-fraction-static", f"{mem:g}"]
    argv += server_flags(opts, "--max-running-requests")
    argv += ["--enable-metrics"]
    argv += _rollout_flags(topo, opts)
    if topo.nnodes > 1:
        argv += ["--nnodes", str(topo.nnodes), "--node-rank", str(topo.node_rank)]
        argv += ["--dist-init-addr", str(topo.dist_init_addr)]
    argv += list(opts.extra_args)
    return EngineCommand(tuple(argv), env, serves_http=topo.node_rank == 0)


def _hardware_flags(topo: Topology) -> list[str]:
    """The cookbook's per-hardware backends (glm-5-deployment.jsx)."""
    if topo.hardware == "amd":
        return ["--trust-remote-code", "--dsa-prefill-backend", "tilelang", "--dsa-decode-backend", "tilelang",
                "--chunked-prefill-size", "131072", "--watchdog-timeout", "1200"]  # fmt: skip
    out = []
    if topo.hardware == "b200" and topo.precision == "fp8":
        out += ["--quantization", "fp8", "--attention-backend", "dsa", "--dsa-decode-backend", "trtllm",
                "--dsa-prefill-backend", "trtllm", "--moe-runner-backend", "flashinfer_trtllm"]  # fmt: skip
    if topo.precision == "fp8" and topo.hardware in ("h200", "b200"):
        out += ["--flashinfer-allreduce-fusion-backend", "auto"]
    return out


def _rollout_flags(topo: Topology, opts: ServerOptions) -> list[str]:
    if opts.rollout_lora_rank is None:
        return []
    if topo.dp > 1:
        raise TopologyError(
            "an RL rollout server loads adapters at run time, which sglang does only without data-parallel replicas: "
            "drop --dp / --dp-attention (run more servers and pass each to --rollout-url instead)"
        )
    return ["--enable-lora", "--max-lora-rank", str(opts.rollout_lora_rank),
            "--lora-target-modules", *opts.rollout_lora_targets]  # fmt: skip
