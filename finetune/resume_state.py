"""Reading a run's resume state (state.pt) as the untrusted input it is.

A run folder (`.OUT.partial`) is a plain folder: a repository, a shared disk or another user can leave one where
`--out` will point, with the settings the user is about to type. `torch.load(weights_only=False)` would run any
code its pickle names, so state is loaded with `weights_only=True` (tensors, numbers, strings, lists, tuples,
dicts: PyTorch's allowlist) and its shape is checked before the loop uses it: a file that is not a state this
program wrote is an error that names it, never a traceback or a half-restored run.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

MAX_STEP = 10**9


class StateError(ValueError):
    """state.pt is not a resume state this program wrote (or it was tampered with)."""


def load_state(path: Path) -> dict:
    """The dict in `path`, loaded without running code; StateError when it is anything else."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as e:
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise StateError(f"{path} is not a resume state this program wrote ({why}); nothing in it was run") from None
    if not isinstance(state, dict):
        raise StateError(f"{path} is not a training state (a {type(state).__name__}, not a dict)")
    return state


def _need(ok: bool, path: Path, what: str) -> None:
    if not ok:
        raise StateError(f"{path}: {what}; delete it to start over")


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def check_training_state(state: dict, path: Path) -> dict:
    """train_loop.training_state's shape: step, params (name -> tensor), optimizer (a state_dict)."""
    _need(_int_in(state.get("step"), 0, MAX_STEP), path, f'"step" must be a whole number 0..{MAX_STEP}')
    params = state.get("params")
    _need(isinstance(params, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                           for k, v in params.items()), path, '"params" must map names to tensors')  # fmt: skip
    opt = state.get("optimizer")
    _need(isinstance(opt, dict) and isinstance(opt.get("state", {}), dict)
          and isinstance(opt.get("param_groups", []), list), path, '"optimizer" must be an optimizer state_dict')  # fmt: skip
    _need(isinstance(state.get("losses", []), list), path, '"losses" must be a list')
    return state


def check_dsa_state(state: dict, path: Path) -> dict:
    """The DSA warm-up's state: a training state tagged with its stage ("warmup", "sparse"; the sparse stage's
    carries the MTP layer's indexer), or, between the stages, the warmed-up indexer ("warmup_done")."""

    def tensors(v: Any) -> bool:
        return isinstance(v, dict) and all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in v.items())

    stage = state.get("stage")
    _need(stage in ("warmup", "warmup_done", "sparse"), path, '"stage" must be warmup, warmup_done or sparse')
    _need(tensors(state.get("mtp_indexer", {})), path, '"mtp_indexer" must map names to tensors')
    kl = state.get("warmup_kl", [])
    _need(isinstance(kl, list) and all(isinstance(x, int | float) for x in kl), path, '"warmup_kl" must be numbers')
    if stage != "warmup_done":
        return check_training_state(state, path)
    _need(_int_in(state.get("step"), 0, MAX_STEP), path, f'"step" must be a whole number 0..{MAX_STEP}')
    _need(tensors(state.get("indexer")), path, '"indexer" must map names to tensors')
    return state


def check_rl_state(state: dict, path: Path) -> dict:
    """finetune.rl.run's state: trainer (a dict), history (rows), consumed / dropped (group numbers), evals."""
    tr = state.get("trainer")
    _need(isinstance(tr, dict) and _int_in(tr.get("version"), 0, MAX_STEP), path, '"trainer" must hold a version')
    _need(isinstance(tr.get("params"), dict) and all(isinstance(v, torch.Tensor) for v in tr["params"].values())
          and isinstance(tr.get("optimizer"), dict), path, '"trainer" must hold params (tensors) and an optimizer')  # fmt: skip
    _need(isinstance(state.get("history"), list) and all(isinstance(h, dict) for h in state["history"]), path,
          '"history" must be a list of rows')  # fmt: skip
    for key in ("consumed", "dropped"):
        v = state.get(key)
        _need(isinstance(v, list | tuple | set) and all(_int_in(g, 0, MAX_STEP) for g in v), path,
              f'"{key}" must be a list of group numbers')  # fmt: skip
    _need(isinstance(state.get("evals", {}), dict), path, '"evals" must be a dict')
    _need(_int_in(state.get("logged", 0), 0, MAX_STEP), path, '"logged" must be a whole number')
    return state


def check_completion_state(state: dict, path: Path) -> dict:
    """`--env completion`'s state (finetune/grpo.py's checkpoints): finetune.rl.run's state with its step."""
    _need(_int_in(state.get("step"), 0, MAX_STEP), path, f'"step" must be a whole number 0..{MAX_STEP}')
    return check_rl_state(state, path)
