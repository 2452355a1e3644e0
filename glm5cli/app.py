"""The root `glm5` Typer app. Command groups live in their own modules; heavy imports happen inside commands."""

from __future__ import annotations

import sys

import typer

from glm5cli import bench_cmd, code_cmd, doctor_cmd, finetune_cmd, model_cmd, serve_cmd
from glm5cli.help_format import WholeSummaries

app = typer.Typer(
    name="glm5",
    help="Serve, run, fine-tune and benchmark GLM-5 as a coding agent on your own repositories.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: option names whole and descriptions wide at 80 columns, [brackets] kept
    cls=WholeSummaries,  # command lists give each summary whole
)

app.command("code", help="Run the coding agent in the current git repository (TUI, or headless with -p).",
            short_help="Run the coding agent in this git repository (TUI, or -p headless).",
            epilog=code_cmd.EPILOG)(code_cmd.code)  # fmt: skip
app.command("serve", help="Serve a GLM-5 checkpoint over an OpenAI-compatible HTTP API.")(serve_cmd.serve)
app.add_typer(
    finetune_cmd.app,
    name="finetune",
    help="Fine-tune on what `glm5 code` recorded: SFT (LoRA or full), agentic RL, cross-stage distillation, MTP alignment.",
    short_help="Fine-tune: SFT (LoRA or full), RL, distillation, MTP alignment.",
)
app.add_typer(bench_cmd.app, name="bench", help="Run agentic and serving benchmarks; reports CI can read.")
app.add_typer(model_cmd.app, name="model", help="Create, inspect, convert and quantize GLM-5 checkpoints.")
app.command("doctor", help="Check which protections (sandbox, network, git, environment) work here.",
            short_help="Check which protections (sandbox, network, git, env) work here.",
            )(doctor_cmd.doctor)  # fmt: skip


# exceptions that mean the user's input is wrong (a checkpoint folder without config.json or weights, a config that
# is not JSON, tensors that do not fit): wherever a command meets one, its message is the error, not a traceback
USER_ERRORS = (("model.config", "ConfigError"), ("model.checkpoint", "CheckpointError"))


def main() -> None:
    from glm5cli import threads

    threads.choose()  # before any command imports torch: its thread count and OpenMP's wait (glm5cli/threads.py)
    try:
        app()
    except Exception as e:  # only the classes of modules already imported can have been raised
        kinds = tuple(getattr(sys.modules[m], c) for m, c in USER_ERRORS if m in sys.modules)
        if not isinstance(e, kinds):
            raise
        from glm5cli.common import fail

        try:
            fail(str(e), hint="a checkpoint folder holds config.json, the weights (model.safetensors or its index) "
                 "and tokenizer.json, as a Hugging Face download or `glm5 model init` writes it")  # fmt: skip
        except typer.Exit as done:
            sys.exit(done.exit_code)


if __name__ == "__main__":
    main()
