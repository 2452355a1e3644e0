"""Agentic RL with the policy sharded over torchrun's ranks (`torchrun ... -m glm5cli finetune rl --qlora`).

Rank 0 runs everything that is not the policy's maths exactly as one process does (run_rl: the orchestrator and
its sessions against the rollout server, the buffer, the log, the evaluation, the weight push), with a
`ShardedTrainer` where the Trainer was. The other ranks only `follow`: each call that needs every rank (a train
step, the trainer's state for state.pt and its restore, the adapter gathered for a push or a step's adapter) is
first broadcast from rank 0 as a command, then run by every rank together. A step's groups travel with its
command; each rank trains its share of the step's samples (Trainer's `dist`). Sampling never runs here: the
rollout server is a separate process (`--rollout-engine process`, or `--rollout-url`).

state.pt holds the trainer's state whole, gathered to rank 0 (torch.distributed.checkpoint's full state dicts,
the optimizer's keyed by parameter name), and is restored by broadcasting it from rank 0: a sharded run resumes
at any world size, but not from a single process's state.pt, nor the reverse (the optimizer's keys differ; the
error says so).
"""

from __future__ import annotations

import torch
import torch.distributed as td

from finetune.rl.trainer import Trainer

STOP = "stop"


class ShardedTrainer:
    """What run_rl calls a trainer, on rank 0 (`lead`), and what the other ranks run (`follow`)."""

    def __init__(self, trainer: Trainer, dist):
        self.trainer, self.dist = trainer, dist

    @property
    def version(self) -> int:
        return self.trainer.version

    # -- rank 0: each call is broadcast, then run here as on every rank --------------------------------------

    def step(self, groups: list) -> dict:
        return self._lead("step", groups)

    def reset_optimizer(self) -> None:
        self._lead("reset_optimizer", None)

    def state(self) -> dict:
        return self._lead("state", None)

    def restore(self, state: dict) -> None:
        if "optimizer_by_name" not in state:
            raise ValueError("this state.pt was written by one process (its optimizer state is keyed by position): "
                             "resume it without torchrun, or delete it to start over")  # fmt: skip
        self._lead("restore", state)

    def adapter_state(self) -> dict:
        """The LoRA factors whole on rank 0 (for a push, or a step's adapter)."""
        return self._lead("adapter_state", None)

    def stop(self) -> None:
        """The followers leave `follow` (rank 0, at the end of a run that finished)."""
        self._send(STOP, None)

    def _lead(self, name: str, payload):
        self._send(name, payload)
        return self._run(name, payload)

    def _send(self, name: str, payload) -> None:
        box = [name, payload if name == "step" else None]  # the state to restore goes by set_state_dict
        td.broadcast_object_list(box, src=0)

    # -- every rank --------------------------------------------------------------------------------------------

    def follow(self) -> None:
        """Run rank 0's commands until it says stop (the ranks other than 0)."""
        while True:
            box = [None, None]
            td.broadcast_object_list(box, src=0)
            name, payload = box
            if name == STOP:
                return
            self._run(name, payload)

    def _run(self, name: str, payload):
        t = self.trainer
        if name == "step":
            return t.step(payload)
        if name == "reset_optimizer":
            return t.reset_optimizer()
        if name == "adapter_state":
            return self.dist.gather(t.model, trained_only=True)
        if name == "state":
            return self._full_state()
        if name == "restore":
            return self._restore(payload)
        raise ValueError(f"unknown command {name!r}")

    def _options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions  # ~2 s: torchrun runs only

        return StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True, **kw)

    def _full_state(self) -> dict | None:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        params, optim = get_state_dict(self.trainer.model, self.trainer.opt, options=self._options())
        if not self.dist.is_main:
            return None
        return {"version": self.trainer.version, "params": params, "optimizer": {}, "optimizer_by_name": optim}

    def _restore(self, state: dict | None) -> None:
        """Every rank's shards of the state rank 0 read (the others pass None)."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        main, t = self.dist.is_main, self.trainer
        opts = self._options(broadcast_from_rank0=True, strict=False)
        # the two apart: set_state_dict takes an empty model dict (the other ranks') as "optimizer only" and skips
        # the model's broadcast there, while rank 0 waits in it
        set_model_state_dict(t.model, state["params"] if main else {}, options=opts)
        set_optimizer_state_dict(t.model, t.opt, state["optimizer_by_name"] if main else {}, options=opts)
        version = torch.tensor([state["version"] if main else 0], dtype=torch.int64)
        self.trainer.version = int(self.dist.all_sum(version))
