"""The slime launch script for agentic RL on GLM-5 with glm5's rollout hook: slime's own GLM-5 recipe
(scripts/run-glm5-744B-A40B.sh at slime 624b824a8: Megatron TP4 + SP, PP4, EP32, CP2 on 32 nodes x 8 GPUs,
colocated sglang engines of 64 GPUs with DP attention and EAGLE/MTP) with the rollout replaced by
finetune.slime.generate and GLM-5's agentic objective as near as slime's flags go: GRPO with the clip 0.2 / 0.28
taken on pi_theta / pi_rollout (`--use-rollout-logprobs`: the rollout logprobs as the behaviour policy, GLM-5
§4.1.2); GLM-5's hard double-sided mask is not one of slime's flags (a --custom-loss-function-path would be). The
router hashes each session to one engine. The script is a template the user reads and runs on the cluster: every path and size is an environment
variable with the recipe's value as its default."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SlimeRun:
    prompts: Path  # OUT/prompts.jsonl (tasks.py)
    n_samples: int = 8  # sessions per task (GRPO's group)
    rollout_batch_size: int = 8  # tasks per rollout
    num_rollout: int = 3000
    max_response_len: int = 8192  # per model call
    max_context_len: int = 131072  # per session's prompt
    temperature: float = 1.0
    max_turns: int = 30
    lr: float = 1e-6
    profile: str = "full"  # the agent profile of every session (agent/profiles.py: full or compact)


SCRIPT = """#!/usr/bin/env bash
# Agentic RL of GLM-5 on slime with glm5's agent, sandbox and grading as the rollout (written by
# `glm5 finetune rl --trainer slime`). Run on the Ray head node of the cluster, with slime checked out in
# SLIME_DIR and glm5 installed (its source in GLM5_ROOT) on every node. Each sample is one glm5 agent session
# in glm5's bench environment, graded by the bench (finetune/slime/generate.py).
set -ex
SLIME_DIR="${{SLIME_DIR:-/root/slime}}"
GLM5_ROOT="${{GLM5_ROOT:-{glm5_root}}}"
BASE_DIR="${{BASE_DIR:-/root}}"
HF_CHECKPOINT="${{HF_CHECKPOINT:-{hf_checkpoint}}}"
NODES="${{NODES:-32}}"
source "${{SLIME_DIR}}/scripts/models/glm5-744B-A40B.sh"   # MODEL_ARGS: slime's GLM-5 architecture

CKPT_ARGS=(
   --hf-checkpoint "$HF_CHECKPOINT"
   --ref-load "${{REF_LOAD:-$BASE_DIR/GLM-5_torch_dist/}}"
   --load "${{SAVE_DIR:-$BASE_DIR/GLM-5_slime/}}"
   --save "${{SAVE_DIR:-$BASE_DIR/GLM-5_slime/}}"
   --save-interval 20
)
ROLLOUT_ARGS=(
   --prompt-data {prompts}
   --input-key prompt --label-key label --metadata-key metadata
   --custom-generate-function-path finetune.slime.generate.generate
   --rollout-shuffle
   --num-rollout {num_rollout}
   --rollout-batch-size {rollout_batch_size}
   --n-samples-per-prompt {n_samples}
   --rollout-max-response-len {max_response_len}
   --rollout-max-context-len {max_context_len}
   --rollout-temperature {temperature}
   --global-batch-size {global_batch}
)
PERF_ARGS=(
   --tensor-model-parallel-size 4 --sequence-parallel
   --pipeline-model-parallel-size 4 --decoder-last-pipeline-num-layers 18
   --expert-model-parallel-size 32 --expert-tensor-parallel-size 1
   --context-parallel-size 2
   --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
   --use-dynamic-batch-size --max-tokens-per-gpu 16384
   --data-pad-size-multiplier 4096 --log-probs-chunk-size 1024
)
GRPO_ARGS=(
   --advantage-estimator grpo
   --kl-loss-coef 0.00 --kl-loss-type low_var_kl --kl-coef 0.00 --entropy-coef 0.00
   --eps-clip 0.2 --eps-clip-high 0.28
   --use-rollout-logprobs
)
OPTIMIZER_ARGS=(
   --optimizer adam --lr {lr} --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
   --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer
)
SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 64
   --sglang-mem-fraction-static 0.70
   --sglang-enable-dp-attention --sglang-ep-size 64 --sglang-dp-size 64 --sglang-moe-dense-tp-size 1
   --sglang-enable-dp-lm-head --sglang-moe-a2a-backend deepep --sglang-deepep-mode auto
   --sglang-speculative-algorithm EAGLE --sglang-speculative-num-steps 3 --sglang-speculative-eagle-topk 1
   --sglang-speculative-num-draft-tokens 4
   --sglang-page-size 64 --sglang-attention-backend nsa
   --sglang-nsa-decode-backend flashmla_sparse --sglang-nsa-prefill-backend flashmla_sparse
   --sglang-cuda-graph-max-bs 8 --sglang-max-running-requests 512 --sglang-chunked-prefill-size 131072
   --sglang-watchdog-timeout 3600
   --router-policy consistent_hashing
)
MISC_ARGS=(
   --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32 --attention-backend flash --moe-enable-deepep --moe-token-dispatcher-type flex
)
RUNTIME_ENV_JSON="{{
  \\"env_vars\\": {{
    \\"PYTHONPATH\\": \\"/root/Megatron-LM/:${{GLM5_ROOT}}\\",
    \\"CUDA_DEVICE_MAX_CONNECTIONS\\": \\"1\\",
    \\"INDEXER_ROPE_NEOX_STYLE\\": \\"0\\",
    \\"GLM5_SLIME_MAX_TURNS\\": \\"{max_turns}\\",
    \\"GLM5_SLIME_PROFILE\\": \\"${{GLM5_SLIME_PROFILE:-{profile}}}\\",
    \\"GLM5_SLIME_WORKDIR\\": \\"${{GLM5_SLIME_WORKDIR:-/tmp/glm5-slime}}\\",
    \\"MASTER_ADDR\\": \\"${{MASTER_ADDR}}\\"
  }}
}}"
cd "$SLIME_DIR"
ray job submit --address="http://127.0.0.1:8265" --runtime-env-json="${{RUNTIME_ENV_JSON}}" \\
-- python3 train.py \\
   --actor-num-nodes "$NODES" --actor-num-gpus-per-node 8 --colocate \\
   --update-weight-buffer-size $(( 1024 * 1024 * 1024 * 2 )) \\
   "${{MODEL_ARGS[@]}}" "${{CKPT_ARGS[@]}}" "${{ROLLOUT_ARGS[@]}}" "${{OPTIMIZER_ARGS[@]}}" "${{GRPO_ARGS[@]}}" \\
   "${{PERF_ARGS[@]}}" "${{SGLANG_ARGS[@]}}" "${{MISC_ARGS[@]}}"
"""


def launch_script(run: SlimeRun, glm5_root: Path, hf_checkpoint: Path) -> str:
    """The script's text (see the module docstring)."""
    return SCRIPT.format(
        glm5_root=glm5_root, hf_checkpoint=shlex.quote(str(hf_checkpoint)), prompts=shlex.quote(str(Path(run.prompts).resolve())), num_rollout=run.num_rollout,
        rollout_batch_size=run.rollout_batch_size, n_samples=run.n_samples, max_response_len=run.max_response_len,
        max_context_len=run.max_context_len, temperature=run.temperature,
        global_batch=run.rollout_batch_size * run.n_samples, lr=run.lr, max_turns=run.max_turns, profile=run.profile,
    )  # fmt: skip
