"""agent/host_path.py under concurrent trials (issue 47): registrations and lookups from many threads at once never
fail, a registration ends with its trial, and a lookup does not slow down with the trials a process has run."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agent import host_path
from agent.environment import Environment


def test_concurrent_registrations_and_lookups_never_fail(tmp_path: Path):
    # Before the fix the guarded folders were one module-level set that `guard` grew in place while `path()`
    # iterated it: with trials registering while others looked programs up, a lookup raised
    # "Set changed size during iteration" (a trial turned into an environment error).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    environ_path = os.pathsep.join([str(bin_dir), *["/usr/bin"] * 50])
    errors: list[BaseException] = []
    stop = threading.Event()

    def register(k: int) -> None:
        try:
            for i in range(300):
                with host_path.guard(*(tmp_path / f"t{k}-{i}-{j}" for j in range(20))):
                    pass
        except BaseException as e:  # noqa: BLE001 - the test reports whatever a thread hit
            errors.append(e)

    def look_up() -> None:
        try:
            while not stop.is_set():
                host_path.path(environ_path)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    before = host_path.guarded()
    lookers = [threading.Thread(target=look_up) for _ in range(4)]
    writers = [threading.Thread(target=register, args=(k,)) for k in range(4)]
    for t in lookers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in lookers:
        t.join()
    assert errors == []
    assert host_path.guarded() == before  # every registration ended with its `with`


def test_a_folder_stays_guarded_while_any_registration_of_it_lives(tmp_path: Path):
    bin_dir = tmp_path / "repo" / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    environ_path = os.pathsep.join([str(bin_dir), "/usr/bin"])
    first = host_path.guard(tmp_path / "repo")
    second = host_path.guard(tmp_path / "repo")
    assert str(bin_dir) not in host_path.path(environ_path).split(os.pathsep)
    first.release()
    first.release()  # idempotent: a second release does not end the other registration
    assert str(bin_dir) not in host_path.path(environ_path).split(os.pathsep)
    second.release()
    assert str(bin_dir) in host_path.path(environ_path).split(os.pathsep)


def test_an_environment_guards_its_folders_until_it_is_closed(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    environ_path = os.pathsep.join([str(repo / ".venv" / "bin"), "/usr/bin"])
    env = Environment(repo, scratch_dir=tmp_path / "scratch")
    assert Path(os.path.realpath(repo)) in host_path.guarded()
    assert str(repo / ".venv" / "bin") not in host_path.path(environ_path).split(os.pathsep)
    env.close()
    assert Path(os.path.realpath(repo)) not in host_path.guarded()
    env.execute("true")  # used again after close: guarded again while it runs commands
    assert Path(os.path.realpath(repo)) in host_path.guarded()
    env.close()
    assert Path(os.path.realpath(repo)) not in host_path.guarded()
