"""GLM-5's launch recipes as glm5 writes them, each beside the source it follows (repository, path, commit).

test_launch_recipes.py checks glm5's argv equals each `argv` here, word for word; test_engine_contracts.py parses
each with the engine's own parser (sglang 0.5.23's ServerArgs, vLLM 0.34's `vllm serve`). Where glm5 differs from
the source's spelling, `note` says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SGL_COOKBOOK = (
    "sgl-project/sglang docs_new/cookbook/autoregressive/GLM/GLM-5.mdx @118d0d0f41cfe97463ed98ed943355bc4904232b"
)
SGL_GENERATOR = ("sgl-project/sglang docs_new/src/snippets/autoregressive/glm-5-deployment.jsx "
                 "@23f291d131c3e5362d1c2321b6335da536cc0ca2")  # fmt: skip
SGL_RL = "sgl-project/sglang docs/advanced_features/sglang_for_rl.md @067bfe93626b99d33a934c78ac24c0c71e5e5e17"
SGL_ARGS = "sglang 0.5.23 (PyPI wheel) sglang/srt/server_args.py, srt/arg_groups/fields/{parallel,exec_,lora}.py"
VLLM_GLM5 = "vllm-project/recipes GLM/GLM5.md + models/zai-org/GLM-5.yaml @8959cf64189c71d36e11c6a30335f923f261b1f7"
VLLM_STRATEGY = "vllm-project/recipes strategies/{name}.yaml @8959cf64189c71d36e11c6a30335f923f261b1f7"

SGLANG = ("sglang", "serve")
VLLM = ("vllm", "serve")
SPEC_ENV = {"SGLANG_ENABLE_SPEC_V2": "1"}
EAGLE_3 = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
FUSION = "--flashinfer-allreduce-fusion-backend auto"
PARSERS = "--tool-call-parser glm47 --reasoning-parser glm45"
VLLM_BASE = "--enable-auto-tool-choice --trust-remote-code --chat-template-content-format string"


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    engine: str  # "sglang" | "vllm"
    topology: dict
    options: dict
    argv: str  # after the program
    env: dict = field(default_factory=dict)
    note: str = ""


RECIPES = [
    Recipe(
        "sglang FP8 8xH200, MTP",
        SGL_COOKBOOK + " §4 'FP8 on H200, all features enabled'",
        "sglang",
        dict(precision="fp8"),
        dict(model="zai-org/GLM-5-FP8", host="0.0.0.0", port=30000),
        f"--model-path zai-org/GLM-5-FP8 --host 0.0.0.0 --port 30000 --tp-size 8 {PARSERS} {EAGLE_3} {FUSION} "
        "--mem-fraction-static 0.85 --enable-metrics",
        SPEC_ENV,
        "the cookbook's --enable-flashinfer-allreduce-fusion is deprecated in 0.5.23 for "
        "--flashinfer-allreduce-fusion-backend=auto (server_args.py add_cli_args)",
    ),
    Recipe(
        "sglang FP8 8xH200, MTP off",
        SGL_GENERATOR + " strategy 'max-throughput' (no speculative flags)",
        "sglang",
        dict(precision="fp8", speculative=None),
        dict(model="zai-org/GLM-5-FP8"),
        f"--model-path zai-org/GLM-5-FP8 --host 127.0.0.1 --port 8000 --tp-size 8 {PARSERS} {FUSION} "
        "--mem-fraction-static 0.85 --enable-metrics",
    ),
    Recipe(
        "sglang FP8 8xH200, MTP 1 draft token",
        SGL_GENERATOR + " strategy 'balanced' (steps 1, draft tokens 2)",
        "sglang",
        dict(precision="fp8", spec_steps=1, spec_draft_tokens=2),
        dict(model="zai-org/GLM-5-FP8"),
        f"--model-path zai-org/GLM-5-FP8 --host 127.0.0.1 --port 8000 --tp-size 8 {PARSERS} "
        f"--speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens 2 {FUSION} --mem-fraction-static 0.85 --enable-metrics",
        SPEC_ENV,
    ),
    Recipe(
        "sglang BF16 2x8 H200, node 1",
        SGL_COOKBOOK + " §3.2 table (H200 BF16 tp=16); multi-node flags of reference/serving-and-benchmarks.md A1.3",
        "sglang",
        dict(precision="bf16", nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:20000"),
        dict(model="zai-org/GLM-5", host="0.0.0.0", socket_ifname="eth0"),
        f"--model-path zai-org/GLM-5 --host 0.0.0.0 --port 8000 --tp-size 16 {PARSERS} {EAGLE_3} "
        "--mem-fraction-static 0.85 --enable-metrics --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:20000",
        {**SPEC_ENV, "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"},
    ),
    Recipe(
        "sglang FP8 8xH200, DP-attention 8",
        SGL_COOKBOOK + " §3.2 'DP Attention' (the DeepSeek-V3.2 page's --tp 8 --dp 8 --enable-dp-attention)",
        "sglang",
        dict(precision="fp8", dp=8, dp_attention=True, speculative=None),
        dict(model="zai-org/GLM-5-FP8"),
        f"--model-path zai-org/GLM-5-FP8 --host 127.0.0.1 --port 8000 --tp-size 8 --attn-dp-size 8 {PARSERS} "
        f"{FUSION} --mem-fraction-static 0.85 --enable-metrics",
        note="0.5.23 deprecates --dp-size N --enable-dp-attention for --attn-dp-size N (fields/parallel.py)",
    ),
    Recipe(
        "sglang INT4 4xH200",
        "zai-org/GLM-5 model card sizes (INT4 ~372 GB fits 4x141 GB); sglang reads "
        "compressed-tensors from config.json, no flag",
        "sglang",
        dict(precision="int4", gpus_per_node=4),
        dict(model="/ckpt/glm-5-int4"),
        f"--model-path /ckpt/glm-5-int4 --host 127.0.0.1 --port 8000 --tp-size 4 {PARSERS} {EAGLE_3} "
        "--mem-fraction-static 0.85 --enable-metrics",
        SPEC_ENV,
    ),
    Recipe(
        "sglang BF16 8x MI300X (AMD)",
        SGL_COOKBOOK + " §4.1 ROCm command; §3.2 'EAGLE ... not currently supported on AMD'",
        "sglang",
        dict(precision="bf16", hardware="amd", speculative=None),
        dict(model="zai-org/GLM-5", host="0.0.0.0", port=30000),  # fmt: skip
        f"--model-path zai-org/GLM-5 --host 0.0.0.0 --port 30000 --tp-size 8 {PARSERS} --trust-remote-code "
        "--dsa-prefill-backend tilelang --dsa-decode-backend tilelang --chunked-prefill-size 131072 "
        "--watchdog-timeout 1200 --mem-fraction-static 0.8 --enable-metrics",
    ),
    Recipe(
        "sglang FP8 8xB200, MTP",
        SGL_GENERATOR + " 'B200 FP8: consolidated optimized flags'",
        "sglang",
        dict(precision="fp8", hardware="b200"),
        dict(model="zai-org/GLM-5-FP8"),
        f"--model-path zai-org/GLM-5-FP8 --host 127.0.0.1 --port 8000 --tp-size 8 {PARSERS} {EAGLE_3} "
        "--quantization fp8 --attention-backend dsa --dsa-decode-backend trtllm --dsa-prefill-backend trtllm "
        f"--moe-runner-backend flashinfer_trtllm {FUSION} --mem-fraction-static 0.9 --enable-metrics",
        SPEC_ENV,
        "the generator's --ep 1 is sglang's default and is left out",
    ),
    Recipe(
        "sglang RL rollout server (LoRA at run time)",
        SGL_RL + " + sglang lora.ipynb (--enable-lora "
        "--max-lora-rank --lora-target-modules for adapters loaded at run time)",
        "sglang",
        dict(precision="fp8", speculative=None),
        dict(
            model="zai-org/GLM-5-FP8",
            api_key="k",
            rollout_lora_rank=16,
            rollout_lora_targets=(
                "q_a_proj",
                "q_b_proj",
                "kv_a_proj_with_mqa",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ),
        ),  # fmt: skip
        f"--model-path zai-org/GLM-5-FP8 --host 127.0.0.1 --port 8000 --tp-size 8 {PARSERS} {FUSION} "
        "--mem-fraction-static 0.85 --api-key k --enable-metrics --enable-lora --max-lora-rank 16 "
        "--lora-target-modules q_a_proj q_b_proj kv_a_proj_with_mqa o_proj gate_proj up_proj down_proj",
    ),
    Recipe(
        "vLLM FP8 8xH200, MTP",
        VLLM_GLM5 + " 'Serving FP8 Model on 8xH200'; base_args",
        "vllm",
        dict(precision="fp8"),
        dict(model="zai-org/GLM-5-FP8", served_model_name="glm-5-fp8"),
        f"zai-org/GLM-5-FP8 --host 127.0.0.1 --port 8000 --tensor-parallel-size 8 {PARSERS} {VLLM_BASE} "
        "--speculative-config.method mtp --speculative-config.num_speculative_tokens 3 "
        "--gpu-memory-utilization 0.85 --served-model-name glm-5-fp8",
    ),
    Recipe(
        "vLLM BF16 2x8 H200 TP, node 1",
        VLLM_STRATEGY.format(name="multi_node_tp"),
        "vllm",
        dict(precision="bf16", nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:20000", speculative=None),
        dict(model="zai-org/GLM-5", socket_ifname="ib0"),
        f"zai-org/GLM-5 --host 127.0.0.1 --port 8000 --tensor-parallel-size 16 {PARSERS} {VLLM_BASE} "
        "--gpu-memory-utilization 0.85 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 20000 "
        "--headless",
        {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"},
    ),
    Recipe(
        "vLLM FP8 2x8 H200 data + expert parallel, node 0",
        VLLM_STRATEGY.format(name="multi_node_dep"),
        "vllm",
        dict(
            precision="fp8",
            nnodes=2,
            node_rank=0,
            dist_init_addr="10.0.0.1:13345",
            dp=16,
            dp_attention=True,
            speculative=None,
        ),  # fmt: skip
        dict(model="zai-org/GLM-5-FP8", socket_ifname="ib0"),
        f"zai-org/GLM-5-FP8 --host 127.0.0.1 --port 8000 --tensor-parallel-size 1 --data-parallel-size 16 "
        f"--enable-expert-parallel {PARSERS} {VLLM_BASE} --gpu-memory-utilization 0.85 "
        "--data-parallel-size-local 8 --data-parallel-address 10.0.0.1 --data-parallel-rpc-port 13345 "
        "--data-parallel-start-rank 0 --data-parallel-hybrid-lb",
        {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"},
    ),
]


def build(recipe: Recipe):
    """glm5's command for `recipe` (the program left as the engine's own name)."""
    from serve.launchers.common import ServerOptions
    from serve.launchers.sglang import sglang_command
    from serve.launchers.topology import Topology
    from serve.launchers.vllm import vllm_command

    topo = Topology(**recipe.topology)
    opts = ServerOptions(**recipe.options)
    return (sglang_command if recipe.engine == "sglang" else vllm_command)(
        topo, opts, SGLANG if recipe.engine == "sglang" else VLLM
    )
