"""Host-side file operations in folders a trial can write never follow a link (issue 40, item 1)."""

from __future__ import annotations

import os

import pytest

from agent.bench.grading import read_reward
from agent.host_files import read_beneath, unlink_beneath, write_beneath


def test_write_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    root, victim = tmp_path / "logs", tmp_path / "victim"
    (root / "verifier").mkdir(parents=True)
    victim.write_text("untouched")
    os.symlink(victim, root / "verifier" / "prediction.diff")
    write_beneath(root, "verifier/prediction.diff", b"diff")
    assert victim.read_text() == "untouched"
    assert (root / "verifier" / "prediction.diff").read_bytes() == b"diff"
    assert not (root / "verifier" / "prediction.diff").is_symlink()


def test_a_linked_folder_on_the_way_is_refused(tmp_path):
    root, outside = tmp_path / "app", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "f").write_text("secret")
    os.symlink(outside, root / "sub")
    with pytest.raises(OSError):
        write_beneath(root, "sub/f", b"x")
    assert (outside / "f").read_text() == "secret"
    assert read_beneath(root, "sub/f", 100) is None
    unlink_beneath(root, "sub/f")  # a link on the way: nothing removed
    assert (outside / "f").exists()
    with pytest.raises(OSError):
        write_beneath(root, "../outside/f", b"x")


def test_unlink_removes_the_link_not_its_target(tmp_path):
    root, victim = tmp_path / "app", tmp_path / "victim"
    root.mkdir()
    victim.write_text("keep")
    os.symlink(victim, root / "t.py")
    unlink_beneath(root, "t.py")
    assert not os.path.lexists(root / "t.py") and victim.read_text() == "keep"


def test_a_verifier_folder_replaced_by_a_link_gives_no_reward(tmp_path):
    # the agent leaves /logs/verifier as a link to a folder holding reward.txt = 1: no verdict, not a pass
    logs, fake = tmp_path / "logs", tmp_path / "fake"
    logs.mkdir()
    fake.mkdir()
    (fake / "reward.txt").write_text("1")
    os.symlink(fake, logs / "verifier")
    reward, _, problem = read_reward(logs / "verifier")
    assert reward is None and "no /logs/verifier/reward.txt" in problem
