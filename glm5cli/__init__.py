"""glm5's command line: a Typer app with one module per command group.

- app.py        the root `glm5` app; mounts the groups below
- model_cmd.py  `glm5 model init|info|convert|quantize`: checkpoints
- code_cmd.py   `glm5 code`: the coding agent (TUI, or headless with -p)
- serve_cmd.py  `glm5 serve`: OpenAI-compatible server (embedded engine, or sglang / vLLM)
- finetune_cmd.py `glm5 finetune`: align-mtp (the MTP layer on the model's own output), sft (LoRA / full / QLoRA)
- rl_cmd.py     `glm5 finetune rl`: GRPO on completions, agentic RL on the bench's tasks
- distill_cmd.py `glm5 finetune distill`: cross-stage on-policy distillation (teachers by domain)
- stages_cmd.py `glm5 finetune dsa-warmup`: DSA indexer warm-up + sparse stage
- plan_cmd.py   `glm5 finetune plan`, and `preflight`: the memory check the training commands run before loading
- slime_cmd.py  `glm5 finetune rl --trainer slime` and `sft --export-slime`: what slime needs, written
- recipe_ui.py  what every finetune command shares: the training progress (TrainProgress, step_bar), the
                ConsoleReporter a finetune recipe reports through, failing() (a recipe's error as the command's)
- bench_cmd.py  `glm5 bench`: agentic and serving benchmarks
- bench_run.py  `glm5 bench swe|terminal`: their flags declared once (OPTIONS -> RunFlags), the run, the report shown
- bench_harness.py what `glm5 bench` says of the SWE-bench harness (predictions, compare) and of --env local's gaps
- common.py     helpers shared by the commands (errors, console, JSON output)
- progress.py   progress on stderr: a live bar on a terminal, a plain line per trial / step in a log
- threads.py    torch's threads and OpenMP's wait policy, chosen in `app.main` before any command imports torch

The CLI parses arguments, resolves configuration and shows progress; the work happens in
`model`, `serve`, `agent` and `finetune`, which are imported inside each command so that
`glm5 --help` answers at once. A finetune command builds its recipe's job from its options, runs it with a
ConsoleReporter inside failing(), and prints the summary the recipe returns.
"""
