"""Every command's --help read at 80 columns: option names whole, lines that fit, choices listed, brackets kept,
and no heavy import on the way (so `glm5 ... --help` answers at once)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from glm5cli.app import app

runner = CliRunner(env={"COLUMNS": "80"})


def _commands(cmd=None, path=()):
    """Every leaf command of the glm5 tree, as its argv path."""
    cmd = cmd or typer.main.get_command(app)
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield list(path)
        return
    for name, sub in subs.items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


def _help(path: list[str]) -> str:
    r = runner.invoke(app, [*path, "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_help_fits_80_columns_and_names_every_option_whole(path):
    text = _help(path)
    cmd = typer.main.get_command(app)
    for part in path:
        cmd = cmd.commands[part]
    for param in cmd.params:
        for name in getattr(param, "opts", []):
            if name.startswith("-"):
                assert re.search(rf"(^|[\s,/]){re.escape(name)}([\s,/=]|$)", text, re.M), f"{name} cut in:\n{text}"
    assert "…" not in text  # rich cut names and words with it
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, long


def test_glm5_serve_help_is_readable_at_80_columns():
    # the user's report: `--served-model-n…`, descriptions squeezed into ~13 characters
    text = _help(["serve"])
    line = next(line for line in text.splitlines() if "--served-model-name" in line)
    assert "Model name clients send" in line  # name and description on one line, not a 13-character column


@pytest.mark.parametrize(
    "path, option, choices",
    [
        (["serve"], "--speculative", "mtp|off"),
        (["serve"], "--quant", "int4"),
        (["serve"], "--dtype", "auto|float32|bfloat16"),
        (["serve"], "--precision", "auto|fp8|bf16|int4"),
        (["serve"], "--engine", "embedded|sglang|vllm"),
        (["code"], "--output-format", "text|json|stream-json"),
        (["code"], "--approval", "auto|deny"),
        (["code"], "--mode", "ask|accept-edits|plan|auto"),
        (["code"], "--profile", "full|compact"),
        (["bench", "swe"], "--env", "local|docker"),
        (["bench", "validate"], "--kind", "swe|terminal"),
        (["bench", "serve"], "--dataset", "random|shared-prefix"),
        (["bench", "serve"], "--api", "completions|chat"),
        (["model", "init"], "--preset", "tiny|small"),
        (["model", "init"], "--dtype", "float32|bfloat16"),
        (["finetune", "rl"], "--rollout-engine", "thread|process"),
        (["finetune", "rl"], "--env", "completion|swe|terminal|scripted"),
        (["finetune", "distill"], "--kl", "full|sampled"),
        (["bench", "swe"], "--agent-profile", "full|compact"),
        (["bench", "swe"], "--agent", "glm5|oracle|nop|cmd:COMMAND"),
        (["finetune", "rl"], "--objective", "auto|double-is|icepop"),
        (["finetune", "rl"], "--loss-agg", "sample|token"),
    ],
)
def test_fixed_choice_options_list_their_choices(path, option, choices):
    text = _help(path)
    line = next(line for line in text.splitlines() if re.match(rf"\s+(-\w, )?{re.escape(option)} <", line))
    assert f"<{choices}>" in line, line


def test_help_keeps_square_brackets_in_descriptions():
    # rich markup ate `[problems]`: the JSON shape printed as `{task: }`
    assert "{task: [problems]}" in " ".join(_help(["bench", "validate"]).split())


def test_no_command_help_imports_torch():
    # `glm5 --help` took 4.3 s on a loaded machine when a help path imported torch
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom glm5cli.app import app\n"
        f"for path in {COMMANDS!r} + [[]]:\n"
        "    r = CliRunner().invoke(app, [*path, '--help'])\n"
        "    assert r.exit_code == 0, (path, r.output)\n"
        "print([m for m in ('torch', 'transformers', 'numpy', 'fastapi', 'textual', 'peft') if m in sys.modules])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


@pytest.mark.parametrize("group", [[], ["bench"], ["finetune"], ["model"]], ids=["glm5", "bench", "finetune", "model"])
def test_command_lists_give_each_summary_whole(group):
    # click cut each summary where the 80-column line ended ("... so that more..."): the list shows it whole
    out = _help(group)
    listing = out.split("Commands:", 1)[1]
    assert "..." not in listing and all(len(line) <= 80 for line in listing.splitlines()), listing
