"""The root CLI: help lists every verb, unbuilt commands fail loudly, --help is fast."""

from __future__ import annotations

import subprocess
import sys
import time

from typer.testing import CliRunner

from glm5cli.app import app

runner = CliRunner()


def test_help_lists_every_verb():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for verb in ("code", "serve", "finetune", "bench", "model"):
        assert verb in result.output


def test_each_verb_has_its_own_help():
    for verb in (["code"], ["serve"], ["finetune"], ["bench"], ["model"]):
        result = runner.invoke(app, [*verb, "--help"])
        assert result.exit_code == 0, result.output
        assert "Usage" in result.output


def test_help_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys, time; t=time.time(); from glm5cli.app import app; "
        "heavy=[m for m in ('torch','transformers','fastapi','textual','git') if m in sys.modules]; "
        "print(heavy); print(time.time()-t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", f"heavy modules imported at startup: {out[0]}"
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "glm5cli", "--help"], capture_output=True, check=True)
    assert time.time() - t0 < 5.0  # generous: a cold interpreter on a loaded 2-core CI box


def test_the_cli_consoles_escape_control_characters_in_what_they_print():
    # task ids, file names and model text reach these prints; rich passes an escape sequence through as is
    import io

    from rich.table import Table

    from glm5cli.common import SafeConsole

    out = io.StringIO()
    c = SafeConsole(file=out, force_terminal=True, width=80)
    table = Table()
    table.add_column("task")
    table.add_row("t\x1b]2;owned\x07")
    c.print("[bold]ok[/] x\x1b]52;c;cm0=\x07", table, highlight=False)
    text = out.getvalue()
    assert "\x1b]" not in text and "\x07" not in text  # no title or clipboard sequence: only rich's own styling
    assert "x\\x1b]52;c;cm0=\\x07" in text and "t\\x1b]2;owned\\x07" in text and "\x1b[1mok" in text


def test_a_broken_checkpoint_is_an_error_message_not_a_traceback(tmp_path):
    # each command meets a broken checkpoint deep inside (config, weights): main() turns the model's own errors
    # into `error: ...` with what a checkpoint holds, exit 1
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{bad")
    for folder, words in (("empty", "no config.json at"), ("bad", "config.json is not valid JSON")):
        r = subprocess.run([sys.executable, "-m", "glm5cli", "serve", str(tmp_path / folder), "--port", "0"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 1, r.stderr
        said = " ".join(r.stderr.split())  # rich wraps at the terminal's width
        assert "Traceback" not in said and words in said and "hint:" in said, r.stderr


def test_off_a_terminal_a_line_is_written_whole():
    # CI logs: rich wrapped every line at 80 columns, mid-word in a progress line or a path
    import io

    from glm5cli.common import SafeConsole

    out = io.StringIO()
    c = SafeConsole(file=out, width=80)
    line = "step 3/10  loss 2.345  " + "/a/long/path" * 12
    c.print(line)
    assert out.getvalue() == line + "\n"
    out = io.StringIO()
    SafeConsole(file=out, width=80, force_terminal=True).print(line)
    assert out.getvalue().count("\n") > 1  # a terminal still wraps at its width
