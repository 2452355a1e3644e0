"""Training checkpoints that resume at another world size: torch.distributed.checkpoint (DCP) in the run folder.

    save_dcp(work, training_state(...), named, dist)   # every rank writes its shards into WORK/dcp-STEP/
    state = load_resume(work, named, dist)             # the newest checkpoint, in this run's layout

A torchrun run (finetune/distributed.py) checkpoints with DCP: each rank writes the shards it holds, and the
files record every tensor's global shape, so a later run reads back whatever shards its own layout needs: 2
ranks -> 1 process, 1 -> 2, 2 -> 4. A plain process keeps writing the loop's `state.pt` (run_dir.RunDir) and
reads a DCP checkpoint too (DCP without a process group). Whichever of the two is newer is resumed from.

`WORK/dcp-STEP/` holds DCP's files and `meta.json` (the step, the losses so far, the optimizer's hyper-
parameters and which state it keeps per parameter), written last by rank 0: a folder without it is a save that
was killed midway, ignored and removed by the next save. Tensors are keyed by parameter name (not the
optimizer's positions), so the checkpoint does not depend on how a rank's optimizer ordered its parameters.

What comes back is the training loop's own state dict (train_loop.training_state: step, params, optimizer,
losses) with every tensor in this run's layout (sharded DTensors under FSDP, plain tensors otherwise), so
`train(resume=state)` restores it as it restores `state.pt`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from pathlib import Path

import torch

from agent.provenance import has_mark, mark
from finetune.resume_state import check_training_state, load_state

META = "meta.json"
STATE_PT = "state.pt"  # run_dir.RunDir's single-process checkpoint


def _trained(named) -> list[str]:
    """The optimizer's parameters in its order (train_loop.train gives it the `named` that require grad)."""
    return [n for n, p in named if p.requires_grad]


def save_dcp(work: Path, state: dict, named, dist=None) -> Path:
    """Write a training_state with DCP into WORK/dcp-STEP (collective: every rank calls it); rank 0 then
    writes meta.json and removes older checkpoints (DCP or state.pt). -> the folder."""
    import torch.distributed.checkpoint as dcp  # ~1.8 s to import: only where a DCP checkpoint is written

    work = Path(work)
    folder = work / f"dcp-{state['step']}"
    names, osd = _trained(named), state["optimizer"]
    order = [i for g in osd["param_groups"] for i in g["params"]]
    optim = {names[i]: osd["state"][i] for i in order if i in osd["state"]}
    with _single_process(dist):
        dcp.save({"params": state["params"], "optim": optim}, checkpoint_id=folder, no_dist=dist is None)
    if dist is None or dist.is_main:
        meta = {
            "step": state["step"],
            "params": sorted(state["params"]),
            "losses": state["losses"],
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in osd["param_groups"]],
            "optim_keys": {n: {k: _kind(v) for k, v in st.items()} for n, st in optim.items()},
            "world_size": dist.world_size if dist else 1,
            # DCP's .metadata is a pickle: it is loaded only under this machine's mark (agent/provenance.py)
            "metadata_mark": _metadata_mark(folder),
        }
        (folder / (META + ".tmp")).write_text(json.dumps(meta))
        (folder / (META + ".tmp")).replace(folder / META)
        for old in work.glob("dcp-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        (work / STATE_PT).unlink(missing_ok=True)
    if dist is not None:
        dist.barrier()  # no rank runs on (or exits) while rank 0 still finishes the folder
    return folder


@contextlib.contextmanager
def _single_process(dist):
    """DCP warns when it runs without a process group: a plain process reading or writing a checkpoint is
    what we mean to do."""
    with warnings.catch_warnings():
        if dist is None:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _kind(v) -> str:
    return "scalar" if isinstance(v, torch.Tensor) and v.dim() == 0 else "param"


def _metadata_mark(folder: Path) -> str:
    return mark((folder / ".metadata").read_bytes())


def latest_dcp(work: Path) -> tuple[Path, dict] | None:
    """The newest complete DCP checkpoint in WORK and its meta, or None. One whose .metadata (a pickle PyTorch
    loads) does not carry this machine's mark is refused: a folder someone else wrote would run code."""
    found = []
    for folder in Path(work).glob("dcp-*"):
        if (folder / META).is_file():
            try:
                meta = json.loads((folder / META).read_text())
                step = int(meta["step"])
            except (ValueError, KeyError, TypeError, RecursionError):
                raise ValueError(f"{folder / META} is not a checkpoint's meta this program wrote") from None
            data = (folder / ".metadata").read_bytes() if (folder / ".metadata").is_file() else b""
            if not has_mark(data, str(meta.get("metadata_mark") or "")):
                raise ValueError(f"{folder} was not written by glm5 on this machine (no valid mark on its "
                                 ".metadata, a pickle): it is not loaded")  # fmt: skip
            found.append((step, folder, meta))
    if not found:
        return None
    _, folder, meta = max(found, key=lambda x: x[0])
    return folder, meta


def load_dcp(folder: Path, meta: dict, named, dist=None) -> dict:
    """A DCP checkpoint as a training_state in this run's layout (DCP reads the shards each tensor needs)."""
    import torch.distributed.checkpoint as dcp  # ~1.8 s to import: only where a DCP checkpoint is read
    from torch.distributed.checkpoint.api import CheckpointException

    by_name = dict(named)
    names = _trained(named)
    if set(meta["params"]) != set(by_name) or not set(meta["optim_keys"]) <= set(names):
        raise ValueError("the checkpoint does not match this model and configuration (different parameters)")
    params = {n: torch.empty_like(p.detach()) for n, p in named}
    optim = {
        n: {
            k: torch.zeros((), dtype=torch.float32) if kind == "scalar" else torch.zeros_like(by_name[n].detach())
            for k, kind in keys.items()
        }
        for n, keys in meta["optim_keys"].items()
    }
    template = {"params": params, "optim": optim}
    try:
        with _single_process(dist):
            dcp.load(template, checkpoint_id=folder, no_dist=dist is None)
    except (CheckpointException, ValueError, RuntimeError) as e:  # DCP's message names the keys and shapes
        raise ValueError(f"{folder} does not fit this model and configuration: {e}") from e
    index = {n: i for i, n in enumerate(names)}
    groups = [dict(g, params=list(range(len(names)))) for g in meta["param_groups"]]
    state = {index[n]: st for n, st in template["optim"].items()}
    return {
        "step": meta["step"],
        "params": template["params"],
        "optimizer": {"state": state, "param_groups": groups},
        "losses": meta["losses"],
    }


def to_layout(state: dict, named) -> dict:
    """A state.pt training_state (whole tensors) in this run's layout: each parameter, and each optimizer
    tensor of its shape, distributed as the parameter is (a DTensor under FSDP); plain parameters as they are."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # ~1.8 s to import: only for a resume

    by_name = dict(named)
    names = _trained(named)

    def like(t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        if isinstance(p, DTensor) and t.shape == p.shape:
            return distribute_tensor(t.to(p.device), p.device_mesh, p.placements)
        return t

    params = {n: like(t, by_name[n]) if n in by_name else t for n, t in state["params"].items()}
    osd = state["optimizer"]
    per = {}
    for i, st in osd["state"].items():
        p = by_name[names[i]] if i < len(names) else None
        per[i] = {k: like(v, p) if p is not None and isinstance(v, torch.Tensor) else v for k, v in st.items()}
    return dict(state, params=params, optimizer={"state": per, "param_groups": osd["param_groups"]})


def load_resume(work: Path, named, dist=None) -> dict | None:
    """The newest checkpoint in WORK (state.pt or DCP), in this run's layout; None when there is none."""
    work = Path(work)
    pt = work / STATE_PT
    plain = None
    if pt.is_file():  # loaded without running code and checked (finetune/resume_state.py)
        plain = check_training_state(load_state(pt), pt)
    found = latest_dcp(work)
    if found is not None and (plain is None or found[1]["step"] >= plain["step"]):
        return load_dcp(*found, named, dist)
    if plain is None:
        return None
    return to_layout(plain, named) if dist is not None else plain
