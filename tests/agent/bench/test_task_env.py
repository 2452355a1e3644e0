"""Local mode gives a task its own environment: its Python version, a venv with no path into glm5's packages, a
writable HOME, and the files its setup generated in every trial's checkout."""

from __future__ import annotations

import subprocess

import pytest

from agent.bench.environments import EnvSpec, InfraError
from agent.bench.harness_specs import local_setup
from agent.bench.local_env import LocalEnvironment
from agent.bench.repos import RepoCache
from agent.bench.setup_cache import find_python, missing_pythons
from agent.bench.tasks import swe_task_from_row
from agent.sandbox import probe
from tests.agent.bench.conftest import calc_row

needs_bwrap = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")


def _env(tmp_path, repo, trial, setup, python=None):
    row = calc_row(repo)
    repos = RepoCache(tmp_path / "cache")
    spec = EnvSpec(tmp_path / trial, app_source=lambda d: repos.checkout(str(repo), row["base_commit"], d),
                   setup=setup, setup_key="calc@1.0", cache_dir=tmp_path / "cache", python=python)  # fmt: skip
    env = LocalEnvironment(spec)
    env.start()
    return env


@needs_bwrap
def test_the_setup_venv_has_no_path_into_glm5s_packages(tmp_path, calc_repo):
    env = _env(tmp_path, calc_repo, "a", "python -m pip --version")
    r = env.exec("python -c 'import sys; print(sys.prefix)'; python -c 'import typer' 2>&1; echo rc=$?")
    assert str(env.venv) in r.output
    assert "ModuleNotFoundError" in r.output and "rc=1" in r.output  # glm5's typer is not the task's
    assert not list(env.venv.glob("lib/python*/site-packages/*.pth")) or all(
        "glm5" not in p.read_text() and "site-packages" not in p.read_text()
        for p in env.venv.glob("lib/python*/site-packages/*.pth")
    )


@needs_bwrap
def test_setup_has_a_writable_home_and_its_generated_files_reach_every_checkout(tmp_path, calc_repo):
    setup = ("echo cache > $HOME/.made-by-setup && mkdir -p $HOME/.cache/pip && "
             "echo 'version = \"1.0\"' > calc_version.py && mkdir -p build && echo so > build/calc.so")  # fmt: skip
    a = _env(tmp_path, calc_repo, "a", setup)
    b = _env(tmp_path, calc_repo, "b", setup)  # cached: the setup does not run again
    assert (a.app_dir / "calc_version.py").is_file()
    assert (b.app_dir / "calc_version.py").read_text() == 'version = "1.0"\n'
    assert (b.app_dir / "build" / "calc.so").read_text() == "so\n"
    r = b.exec("touch $HOME/x && echo home-ok")
    assert "home-ok" in r.output and r.returncode == 0, r.output
    # the generated files are the environment's, not the answer: the prediction leaves them out, so applying it
    # where they were restored does not collide
    from agent.bench.repos import working_tree_diff

    base = calc_row(calc_repo)["base_commit"]
    for env in (a, b):
        (env.app_dir / "calc.py").write_text("changed\n")
        diff = working_tree_diff(env.app_dir, base)
        assert "calc.py" in diff and "calc_version.py" not in diff and "calc.so" not in diff, diff


@needs_bwrap
def test_the_tasks_python_version_is_used_where_the_machine_has_it(tmp_path, calc_repo):
    try:
        find_python("3.9")
    except InfraError:
        pytest.skip("this machine has no Python 3.9")
    env = _env(tmp_path, calc_repo, "a", None, python="3.9")
    r = env.exec("python -c 'import sys; print(sys.version_info[:2])'")
    assert "(3, 9)" in r.output, r.output


@needs_bwrap
def test_a_python_the_machine_lacks_is_said_plainly(tmp_path, calc_repo):
    with pytest.raises(InfraError, match=r"needs Python 3\.4, which this machine does not have: use --env docker"):
        _env(tmp_path, calc_repo, "a", None, python="3.4")
    task = swe_task_from_row({**calc_row(calc_repo), "python": "3.4"}, "t:1")
    assert missing_pythons([task]) == {"3.4": ["acme__calc-1"]}


def test_find_python_checks_the_version_it_finds(tmp_path, monkeypatch):
    # a `python3.9` on PATH that is some other version (a pyenv shim with no 3.9 selected, a stale link) is no 3.9
    fake = tmp_path / "bin" / "python3.4"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 3.11\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    with pytest.raises(InfraError, match="3.4"):
        find_python("3.4")


def test_local_setup_of_a_published_row():
    dockerfile = ("FROM sweb.env.py.x86_64.abc:latest\nRUN source /opt/miniconda3/bin/activate && "
                  "conda create -n testbed python=3.9 mpmath=1.3 'flake8' -y && conda activate testbed && "
                  "python -m pip install mpmath==1.3.0 flake8-comprehensions\n")  # fmt: skip
    script = ("#!/bin/bash\nsource /opt/miniconda3/bin/activate\nconda activate testbed\ncd /testbed\n"
              "python -m pip install -e .\ngit checkout abc t.py\ngit apply -v - <<'EOF'\npip install evil\nEOF\n"
              ": '>>>>> Start Test Output'\nbin/test t.py\n: '>>>>> End Test Output'\n")  # fmt: skip
    row = {"instance_id": "sympy__sympy-1", "repo": "sympy/sympy", "base_commit": "a", "problem_statement": "p",
           "eval_script": script, "dockerfile": dockerfile, "log_parser": "parse_log_sympy"}  # fmt: skip
    task = swe_task_from_row(row, "t:1")
    assert task.python == "3.9"
    assert local_setup(task) == ("python -m pip install 'mpmath==1.3.*' 'flake8'\n"
                                 "python -m pip install mpmath==1.3.0 flake8-comprehensions\n"
                                 "python -m pip install -e .")  # fmt: skip
    assert local_setup(swe_task_from_row({**row, "setup": "make"}, "t:1")) is None


def test_pyenv_pythons_are_found(tmp_path, monkeypatch):
    exe = tmp_path / "versions" / "3.4.10" / "bin" / "python3.4"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho 3.4\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert find_python("3.4") == str(exe)
    assert subprocess.run([str(exe)], capture_output=True, text=True).stdout == "3.4\n"


def test_local_mode_names_what_it_cannot_honour(tmp_path):
    from agent.bench.local_gaps import local_gaps
    from agent.bench.tasks import load_terminal_task

    task_dir = tmp_path / "t"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "tests" / "test.sh").write_text("exit 0\n")
    (task_dir / "instruction.md").write_text("do it\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        "# a comment\nFROM python:3.13-slim\nRUN apt-get update && \\\n    apt-get install -y jq\nENV MODE=strict\n"
        "WORKDIR /app\nCOPY . /app/\nCOPY data.csv /srv/data.csv\nRUN pip install pandas\n"
    )
    gaps = local_gaps(load_terminal_task(task_dir))
    assert gaps == ["FROM python:3.13-slim (this machine's system, glm5's Python first on PATH)",
                    "2 RUN instruction(s)", "ENV MODE=strict", "COPY data.csv /srv/data.csv"]  # fmt: skip
    (task_dir / "environment" / "Dockerfile").write_text("FROM python:3.13-slim\nWORKDIR /app\nCOPY . /app\n")
    assert local_gaps(load_terminal_task(task_dir)) == [
        "FROM python:3.13-slim (this machine's system, glm5's Python first on PATH)"
    ]
    row = {"instance_id": "a__b-1", "repo": "a/b", "base_commit": "c", "problem_statement": "p"}
    assert local_gaps(swe_task_from_row(row, "t:1")) == []
    assert local_gaps(swe_task_from_row({**row, "image": "org/img:1"}, "t:1")) == ["its image org/img:1"]


@needs_bwrap
def test_a_local_run_says_what_it_cannot_honour(tmp_path):
    from typer.testing import CliRunner

    from glm5cli.app import app

    r = CliRunner().invoke(app, ["bench", "terminal", "--suite", "builtin", "--filter", "word-frequency", "--agent",
                                 "oracle", "--out", str(tmp_path / "run")])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "--env local cannot honour parts of 1 task(s); --env docker does" in r.output
    assert "FROM python:3.12-slim" in r.output and "RUN instruction(s)" in r.output


def test_excluding_generated_files_never_follows_a_planted_link(tmp_path, calc_repo):
    """In docker mode the setup can write /app/.git: a .git/info made a link to a host folder must not take the
    host-side append (and `exclude` made a link to a host file neither)."""
    from agent.bench.repos import RepoCache
    from agent.bench.setup_cache import exclude_generated

    app = tmp_path / "app"
    RepoCache(tmp_path / "cache").checkout(str(calc_repo), calc_row(calc_repo)["base_commit"], app)
    (app / "generated.txt").write_text("x\n")
    victim = tmp_path / "host"
    victim.mkdir()
    import shutil

    shutil.rmtree(app / ".git" / "info", ignore_errors=True)
    (app / ".git" / "info").symlink_to(victim)
    exclude_generated(app)
    assert list(victim.iterdir()) == []
    (app / ".git" / "info").unlink()
    (app / ".git" / "info").mkdir()
    (victim / "file").write_text("host\n")
    (app / ".git" / "info" / "exclude").symlink_to(victim / "file")
    exclude_generated(app)
    assert (victim / "file").read_text() == "host\n"
    (app / ".git" / "info" / "exclude").unlink()
    exclude_generated(app)
    assert "/generated.txt" in (app / ".git" / "info" / "exclude").read_text()
