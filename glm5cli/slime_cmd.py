"""`glm5 finetune rl --trainer slime`: write what slime needs to run glm5's agentic RL at GLM-5's scale (the
prompt data and the launch script, finetune/slime/); nothing trains here."""

from __future__ import annotations

import os
from pathlib import Path

from glm5cli.common import EXIT_USAGE, console, fail, print_json


def write_slime_run(model: Path, out: Path, env: str, tasks_file: Path | None, task_dirs: list[Path], steps: int,
                    prompts_per_step: int, group_size: int, max_new_tokens: int, max_turns: int, temperature: float,
                    lr: float, json_out: bool, profile: str | None = None) -> None:  # fmt: skip
    """OUT/prompts.jsonl (the tasks as slime prompt rows) and OUT/run-glm5-slime.sh; OUT must not exist."""
    # the bench's tasks and finetune.slime: imported here, not at the top (`glm5 --help`'s speed)
    from agent.bench.tasks import TaskError
    from finetune.slime.launch import SlimeRun, launch_script
    from finetune.slime.tasks import prompt_rows, write_prompt_data

    if env not in ("swe", "terminal"):
        fail("--trainer slime runs agent sessions: --env swe (--tasks) or --env terminal (task folders)",
             code=EXIT_USAGE)  # fmt: skip
    if out.exists():
        fail(f"{out} exists: give a new directory", code=EXIT_USAGE)
    try:
        rows = prompt_rows(env, tasks_file, task_dirs)
    except (TaskError, OSError, ValueError) as e:
        fail(str(e), code=EXIT_USAGE)
    if not rows:
        fail("no tasks to write", code=EXIT_USAGE)
    tmp = out.with_name(f".{out.name}.partial")
    tmp.mkdir(parents=True, exist_ok=False)
    write_prompt_data(rows, tmp / "prompts.jsonl")
    run = SlimeRun(out.resolve() / "prompts.jsonl", n_samples=group_size, rollout_batch_size=prompts_per_step,
                   num_rollout=steps, max_response_len=max_new_tokens, temperature=temperature,
                   max_turns=max_turns, lr=lr, profile=profile or "full")  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    script = tmp / "run-glm5-slime.sh"
    script.write_text(launch_script(run, root, model.resolve()))
    os.chmod(script, 0o755)
    tmp.rename(out)
    summary = {"out": str(out), "tasks": len(rows), "prompt_data": str(out / "prompts.jsonl"),
               "launch": str(out / "run-glm5-slime.sh")}  # fmt: skip
    if json_out:
        print_json(summary)
        return
    console.print(f"wrote {len(rows)} tasks to {summary['prompt_data']} and the launch script {summary['launch']}")
    console.print("run it on the Ray head node of the cluster: SLIME_DIR=/path/to/slime " + summary["launch"])


def export_sft(out: Path, seqs: list, report: dict, json_out: bool) -> None:
    """`finetune sft --export-slime OUT`: OUT/sft.jsonl from the sequences glm5's SFT would train on."""
    from finetune.slime.sft import write_sft_data  # here, not at the top: `glm5 --help`'s speed

    if out.exists():
        fail(f"{out} exists: give a new directory", code=EXIT_USAGE)
    if not seqs:
        fail("no responses to export: the data holds no model turns to learn from")
    tmp = out.with_name(f".{out.name}.partial")
    tmp.mkdir(parents=True, exist_ok=False)
    n = write_sft_data(seqs, tmp / "sft.jsonl")
    tmp.rename(out)
    summary = {"out": str(out / "sft.jsonl"), "sequences": n, "target_tokens": sum(sum(m) for _, m in seqs),
               "data": report}  # fmt: skip
    if json_out:
        print_json(summary)
        return
    console.print(f"wrote {n} sequences ({summary['target_tokens']:,} target tokens) to {summary['out']}")
    console.print("slime: --rollout-function-path finetune.slime.sft.generate_rollout --prompt-data "
                  f"{summary['out']} --input-key prompt --metadata-key metadata --loss-type sft_loss")  # fmt: skip
