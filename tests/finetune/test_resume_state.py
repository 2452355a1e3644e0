"""Resume state is data another party could have written (issue 40, item 4): a planted `OUT.partial/state.pt`
with the settings the user will type runs no code, and what it holds is checked before it is used."""

from __future__ import annotations

import json
import os

import pytest
import torch

from finetune.run_dir import RunDir, RunError


class _Boom:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


SETTINGS = {"model": "ckpt", "steps": 3}


def _planted(tmp_path, state) -> tuple:
    """A folder where --out will point, with the settings the user will type: made by someone else."""
    work = tmp_path / ".out.partial"
    work.mkdir()
    (work / "run.json").write_text(json.dumps(SETTINGS))
    (work / "sequences.json").write_text(json.dumps({"ids": [[1, 2, 3]]}))
    torch.save(state, work / "state.pt")
    return SETTINGS, tmp_path / "out"


def _ours_then_replaced(tmp_path, state) -> tuple:
    """A run this machine started, whose state.pt was replaced afterwards (a folder another party can write)."""
    out = tmp_path / "out"
    RunDir(out, SETTINGS).start({"ids": [[1, 2, 3]]})
    torch.save(state, tmp_path / ".out.partial" / "state.pt")
    return SETTINGS, out


def test_a_planted_run_folder_is_not_resumed_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    settings, out = _planted(tmp_path, {"step": 1, "x": _Boom(marker)})
    with pytest.raises(RunError, match="did not start"):
        RunDir(out, settings).start({"n": 1})
    assert not marker.exists()


def test_a_pickle_put_into_our_own_run_folder_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    settings, out = _ours_then_replaced(tmp_path, {"step": 1, "x": _Boom(marker)})
    with pytest.raises(RunError, match="state.pt"):
        RunDir(out, settings).start({"n": 1})
    assert not marker.exists()


def test_data_swapped_into_our_own_run_folder_is_refused(tmp_path):
    settings, out = _ours_then_replaced(tmp_path, {"step": 0, "params": {}, "optimizer": {}})
    (tmp_path / ".out.partial" / "sequences.json").write_text(json.dumps({"ids": [[6, 6, 6]]}))
    with pytest.raises(RunError, match="did not start"):
        RunDir(out, settings)


@pytest.mark.parametrize(
    "state, why",
    [
        ([1, 2], "not a training state"),
        ({"step": -4, "params": {}, "optimizer": {}}, "step"),
        ({"step": 10**12, "params": {}, "optimizer": {}}, "step"),
        ({"step": 1, "params": {"w": "not a tensor"}, "optimizer": {}}, "params"),
    ],
)
def test_a_state_that_is_not_ours_is_refused_by_name(tmp_path, state, why):
    settings, out = _ours_then_replaced(tmp_path, state)
    with pytest.raises(RunError, match=why):
        RunDir(out, settings).start({"n": 1})


def test_our_own_state_still_resumes(tmp_path):
    settings, out = _ours_then_replaced(tmp_path, {"step": 2, "params": {"w": torch.ones(2)}, "optimizer": {
        "state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}, "losses": [1.5, None]})  # fmt: skip
    run = RunDir(out, settings)
    assert run.saved_sequences() == {"ids": [[1, 2, 3]]}
    state = run.start({"ids": [[1, 2, 3]]})
    assert state["step"] == 2 and torch.equal(state["params"]["w"], torch.ones(2))


def test_a_planted_dcp_checkpoint_runs_nothing(tmp_path):
    # DCP's .metadata is read with pickle by PyTorch: a dcp-STEP/ folder someone else wrote is refused first
    import pickle

    from finetune.dist_checkpoint import load_resume

    marker = tmp_path / "pwned"
    folder = tmp_path / "dcp-99"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(_Boom(marker)))
    (folder / "meta.json").write_text(json.dumps({"step": 99, "params": [], "optim_keys": {}, "param_groups": []}))
    with pytest.raises(ValueError, match="not written by glm5 on this machine"):
        load_resume(tmp_path, [])
    assert not marker.exists()
