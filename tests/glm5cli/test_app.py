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
