"""The glm5 commands a proof run is made of: each stage is one CLI call a user could type, run as a subprocess.

`glm5(*args)` is the argv of `python -m glm5cli ARGS` with the interpreter that runs the proof, so a worktree's
packages are the ones used. The layout of a run folder:

    RUN/proof.json                 the configuration (a resumed run must ask for the same)
    RUN/tasks/{train,heldout,dev}/ the repair family's splits (repos + SWE-bench JSONL); dev: RL's in-run
                                   evaluation (held-out names, instances of its own), never the measurement
    RUN/expert/                    `glm5 bench swe` of the expert on train: the SFT data
    RUN/corpus/chat.jsonl          the base model's synthetic conversations; copy.jsonl, drill.jsonl: its copy
                                   drills (made-up names; the family's); forget.jsonl: renames only;
                                   distill.jsonl: every turn's context in the train split's expert sessions
    RUN/models/<stage>/            init, base-copy, base-dense, base, sft, rl, rl-sync, forget, distill: each
                                   stage's checkpoint (full fine-tuning, or LoRA merged: servable as it is)
    RUN/bench/<stage>/             `glm5 bench swe` of that checkpoint on held-out, served with INT4 + MTP
    RUN/logs/<step>.log            every subprocess's output
    RUN/config/config.toml         the GLM5_CONFIG_DIR of every subprocess: the response cap and the agent
                                   profile (the user's ~/.config/glm5 is not read)
    RUN/table.{md,json}, RUN/plots/*.png
"""

from __future__ import annotations

import sys
from pathlib import Path

from finetune.proof.config import ProofConfig, teacher_of

MODEL_NAME = "glm5-proof"


def glm5(*args: object) -> list[str]:
    return [sys.executable, "-m", "glm5cli", *map(str, args)]


def shown(argv: list[str]) -> str:
    """argv as the user would type it."""
    return " ".join(["glm5", *argv[3:]])


def task_file(run: Path, split: str) -> Path:
    return run / "tasks" / split / f"repair-{split}.jsonl"


def model_dir(run: Path, stage: str) -> Path:
    return run / "models" / stage


def previous(stage: str, stages: tuple[str, ...]) -> str:
    """The checkpoint a stage starts from: the stage before it in this run, or the random init (an ablation
    such as `--stages sft,rl` fine-tunes the untrained model)."""
    i = stages.index(stage)
    return stages[i - 1] if i else "init"


def init_cmd(run: Path, c: ProofConfig) -> list[str]:
    sets = [a for kv in c.model for a in ("--set", kv)]
    return glm5("model", "init", "--preset", c.preset, *sets, "--out", model_dir(run, "init"), "--seed", c.seed)


def _sft(src: Path, out: Path, data: Path, steps: int, lr: float, c: ProofConfig, only_resolved: bool) -> list[str]:
    outcomes = "--only-resolved" if only_resolved else "--all-outcomes"
    return glm5("finetune", "sft", src, "--out", out, "--data", data, "--full", "--train-mtp", "--mtp-steps",
                c.mtp_steps, "--steps", steps, "--lr", lr, "--batch-size", c.batch_size, "--max-len", c.max_len,
                "--seed", c.seed, outcomes, "--save-every", max(1, steps // 4))  # fmt: skip


def _pretrain(run: Path, c: ProofConfig, src: str, out: str, data: list[str], steps: int, lr: float) -> list[str]:
    """A phase of the base model's training: full, every key visible, packed rows of base_pack_len."""
    files = [a for name in data for a in ("--data", run / "corpus" / name)]
    return glm5("finetune", "sft", model_dir(run, src), "--out", model_dir(run, out), *files, "--full",
                "--train-mtp", "--mtp-steps", c.mtp_steps, "--dense-attention", "--pack", "--steps", steps, "--lr", lr,
                "--batch-size", c.batch_size, "--max-len", c.base_pack_len, "--seed", c.seed, "--all-outcomes",
                "--save-every", max(1, steps // 4))  # fmt: skip


def base_copy_cmd(run: Path, c: ProofConfig) -> list[str]:
    """The base model's first phase, from scratch: copy drills of made-up names."""
    return _pretrain(run, c, "init", "base-copy", ["copy.jsonl"], c.copy_steps, c.copy_lr)


def base_dense_cmd(run: Path, c: ProofConfig) -> list[str]:
    """The base model's pretraining on the corpus and the copy drills: from the copy phase's checkpoint (or from
    scratch without one)."""
    src = "base-copy" if c.copy_steps else "init"
    return _pretrain(run, c, src, "base-dense", ["chat.jsonl", "drill.jsonl"], c.base_steps, c.base_lr)


def stage_cmd(run: Path, stage: str, c: ProofConfig) -> list[str]:
    """The command that trains `stage` from the previous stage's checkpoint."""
    src, out = model_dir(run, previous(stage, c.stages)), model_dir(run, stage)
    if stage == "base":  # DSA for the dense base: the indexers learn its attention, then a sparse stage
        return glm5("finetune", "dsa-warmup", model_dir(run, "base-dense"), "--out", out, "--data",
                    run / "corpus" / "chat.jsonl", "--warmup-steps", c.dsa_warmup_steps, "--lr", c.dsa_warmup_lr,
                    "--sparse-steps", c.dsa_sparse_steps, "--sparse-lr", c.dsa_sparse_lr, "--batch-size",
                    c.batch_size, "--max-len", c.max_len, "--seed", c.seed,
                    "--save-every", max(1, (c.dsa_warmup_steps + c.dsa_sparse_steps) // 4))  # fmt: skip
    if stage == "sft":
        return _sft(src, out, run / "expert", c.sft_steps, c.sft_lr, c, only_resolved=True)
    if stage == "forget":
        return _sft(src, out, run / "corpus" / "forget.jsonl", c.forget_steps, c.forget_lr, c, only_resolved=False)
    if stage == "rl":
        return _rl(run, c, src, out, sync=False)
    if stage == "distill":
        teacher = model_dir(run, teacher_of(c.stages) or "")
        return glm5("finetune", "distill", src, "--teacher", teacher, "--prompts", distill_prompts(run), "--out", out,
                    "--full", "--steps", c.distill_steps, "--prompts-per-step", c.distill_prompts_per_step,
                    "--max-new-tokens", c.max_response_tokens, "--lr", c.distill_lr, "--seed", c.seed,
                    "--save-every", max(1, c.distill_steps // 4))  # fmt: skip
    raise ValueError(f"no command for stage {stage!r}")


def distill_prompts(run: Path) -> Path:
    return run / "corpus" / "distill.jsonl"


def _rl(run: Path, c: ProofConfig, src: Path, out: Path, sync: bool) -> list[str]:
    """Agentic RL on the train split. The async stage evaluates itself on dev (`--eval-tasks`); the synchronous
    baseline skips those evaluations (minutes each): its curve is the per-step rewards, beside async's. With the
    proof's INT4 deployment, RL trains its adapter on SFT's INT4 weights (`--quant int4`): the policy it samples,
    trains and evaluates on dev is the one the proof serves and benches."""
    dev = () if sync else ("--eval-tasks", task_file(run, "dev"), "--eval-samples", c.rl_eval_samples)
    return glm5("finetune", "rl", src, "--env", "swe", "--tasks", task_file(run, "train"), "--out", out,
                "--merge", "--steps", c.rl_steps, "--lr", c.rl_lr, "--max-new-tokens", c.max_response_tokens,
                "--temperature", c.rl_temperature, "--group-size", c.rl_group_size,
                "--groups-per-step", c.rl_groups_per_step, "--max-turns", c.max_turns,
                "--max-model-len", c.max_len + 1024, "--concurrency", c.concurrency, "--seed", c.seed,
                "--thinking" if c.thinking else "--no-thinking", *dev,
                *(("--quant", c.quant) if c.quant == "int4" else ()),
                *(("--dynamic-sampling", c.rl_dynamic_sampling) if c.rl_dynamic_sampling else ()),
                *(("--save-every", c.rl_curve_every) if c.rl_curve_every else ()),
                *(("--sync",) if sync else ()))  # fmt: skip


def rl_sync_cmd(run: Path, c: ProofConfig) -> list[str]:
    """The synchronous RL baseline (roll out, then train) from the same start as the async stage: only its
    learning curve is kept (RUN/models/rl-sync/rl_log.jsonl), for the plot beside async's."""
    return _rl(run, c, model_dir(run, previous("rl", c.stages)), model_dir(run, "rl-sync"), sync=True)


def expert_cmd(run: Path, c: ProofConfig, base_url: str) -> list[str]:
    # --force: a resumed run's expert listens on another port; it is the same expert
    return glm5("bench", "swe", task_file(run, "train"), "--out", run / "expert", "--agent", "glm5",
                "--base-url", base_url, "--model", "glm5-expert", "-n", c.concurrency, "--max-turns", 8,
                "--agent-profile", c.agent_profile, "--force")  # fmt: skip


def serve_cmd(model: Path, port: int, c: ProofConfig, api_key: str, lora: Path | None = None) -> list[str]:
    return glm5("serve", model, "--port", port, "--served-model-name", MODEL_NAME, "--quant", c.quant,
                "--speculative", c.speculative, "--max-model-len", c.max_len + 1024, "--api-key", api_key,
                "--no-access-log", *(("--lora", lora) if lora is not None else ()))  # fmt: skip


def rl_step_adapter(run: Path, step: int) -> Path:
    """The LoRA adapter RL wrote after `step` (`glm5 finetune rl --save-every`)."""
    return model_dir(run, "rl") / "adapters" / f"step-{step}"


def bench_cmd(run: Path, stage: str, c: ProofConfig, base_url: str, key_env: str) -> list[str]:
    # --force: a resumed run's server has another port and key; RUN/proof.json pins everything else.
    # --seed: every stage meets the same random draws (attempt a at task t, its n-th request: the same seed), so a
    # stage that changed little samples the sessions the stage before it did, and `bench compare` pairs them
    return glm5("bench", "swe", task_file(run, "heldout"), "--out", run / "bench" / stage, "--agent", "glm5",
                "--base-url", base_url, "--model", MODEL_NAME, "--api-key-env", key_env, "-k", c.k,
                "-n", c.concurrency, "--max-turns", c.max_turns, "--temperature", c.temperature,
                "--agent-profile", c.agent_profile, "--seed", c.seed, "--force")  # fmt: skip


def compare_cmd(run: Path, a: str, b: str) -> list[str]:
    return glm5("bench", "compare", run / "bench" / a, run / "bench" / b, "--json")


def agent_config(c: ProofConfig) -> str:
    """RUN/config/config.toml: the bench agent's provider sends max_tokens and the thinking switch with every
    request, and every agent (the bench's, RL's rollouts) uses the run's profile."""
    thinking = "true" if c.thinking else "false"
    return (f"[providers.local]\nextra_body = {{ max_tokens = {c.max_response_tokens}, "
            f"chat_template_kwargs = {{ enable_thinking = {thinking} }} }}\n\n"
            f"[agent]\nprofile = \"{c.agent_profile}\"\n")  # fmt: skip
