"""Data-parallel training under `torchrun` with FSDP2: the process group, the sharding, each rank's rows.

    dist = Distributed.from_env()                 # None outside torchrun (RANK / WORLD_SIZE / LOCAL_RANK unset)
    dist.init()                                   # gloo on CPU, nccl on CUDA
    named = dist.shard(model, named)              # fully_shard per decoder layer + root; -> the sharded `named`
    out = dist.backward(batch, micro_batch, loss_of)   # this rank's rows of the global batch, the global loss

What it keeps equal to one process: every rank draws the same global batch (same seed) and trains on its own
contiguous rows of it; each rank's loss is its targets' summed cross-entropy divided by the *global* batch's
target count, and the gradient reduction sums (divide factor 1) instead of averaging, so the reduced gradient
is exactly the single-process gradient of the whole batch (up to summation order). The logged loss is summed
over the ranks, so every rank holds the single-process loss curve.

Every rank runs the same number of forwards and backwards (FSDP all-gathers each layer in its forward): a rank
with fewer rows (batch 3 on 2 ranks) or none (batch 1) runs empty micro-batches, whose loss is exactly 0.
Routed experts that get no token on one rank get a zero gradient (`set_reduce_scatter_unused_params`), so the
ranks' reduce-scatters match; one that no rank's rows reached gets its gradient set back to None after the
reduction, as one process would leave it (AdamW then skips it rather than moving it by its momentum).

Mixed precision (CUDA only): bf16 parameters in forward and backward, fp32 gradient reduction, fp32 master
weights and optimizer state (the model is loaded in fp32). On CPU everything stays fp32.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as td
from torch import nn

from finetune.train_loop import LossTerms, backward_each, micro_batches
from model.moe import MoE


@dataclass
class Distributed:
    """This process's place in a torchrun job (and, once `shard` ran, the FSDP root it trains through)."""

    rank: int
    world_size: int
    local_rank: int
    root: torch.nn.Module | None = field(default=None, repr=False)  # the trained model's
    _roots: dict = field(default_factory=dict, repr=False)  # id(model) -> its FSDP root (a frozen teacher's too)
    _owners: list = field(default_factory=list, repr=False)  # modules that hold trained parameters directly
    _used: set = field(default_factory=set, repr=False)  # those whose forward ran on real rows this step
    _recording: bool = field(default=False, repr=False)

    @classmethod
    def from_env(cls, env: dict | None = None) -> Distributed | None:
        """torchrun's RANK / WORLD_SIZE / LOCAL_RANK, or None when they are not set (a plain process)."""
        env = os.environ if env is None else env
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return None
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints progress and writes the log, the adapter and the checkpoint."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    def init(self, timeout_s: float | None = None) -> None:
        """Join the process group (torchrun's MASTER_ADDR / MASTER_PORT rendezvous). On CPU each rank gets
        the machine's cores divided among the ranks (torch would otherwise start one thread per core in every
        rank and oversubscribe the machine). `timeout_s`: how long a collective may wait for the other ranks
        (torch's default, 10-30 minutes, where None; agentic RL's ranks wait for rank 0's sessions for longer)."""
        if td.is_initialized():
            return
        kw = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            td.init_process_group("nccl", device_id=self.device, **kw)
        else:
            if "OMP_NUM_THREADS" not in os.environ:
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world_size))
            td.init_process_group("gloo", **kw)

    def close(self) -> None:
        """Leave the group, every rank together: a rank that tore its connections down while another still used
        them (rank 0 writing, or computing alone) would break that rank's collectives."""
        if td.is_initialized():
            td.barrier()
            td.destroy_process_group()

    def barrier(self) -> None:
        td.barrier()

    # ---- the model ----------------------------------------------------------------------------------------
    def shard(self, model, named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """FSDP2 over `model` in place: `fully_shard` on every decoder layer (the MTP layer included), then a
        root around the model (embeddings, final norm, lm_head: _LossRoot). -> `named` with the sharded parameters (DTensors) that replaced
        the originals, looked up by name; buffers (the routers' bias) stay whole on every rank."""
        _untie_experts(model)
        model.to(self.device)
        return self.wrap(model, named)

    def wrap(self, model, named: list[tuple[str, torch.Tensor]], cast: bool = True) -> list[tuple[str, torch.Tensor]]:
        """`shard`'s FSDP2 part, for a model already on its device or still on meta (finetune/sharded_load.py
        materialises it after). `cast` False: no bf16 cast of the parameters on CUDA (a frozen FP8 / INT4 base is
        gathered as stored and dequantised by its modules; the adapter computes in fp32)."""
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # ~1.7 s: torchrun only

        mp = MixedPrecisionPolicy()
        if self.device.type == "cuda":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cast else None, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        root = fully_shard(_LossRoot(model), mp_policy=mp)
        self._roots[id(model)] = root
        for unit in root.modules():
            if isinstance(unit, FSDPModule):  # (the setters reach one unit's own parameter groups only)
                # Sum, not average: each rank's loss is already divided by the global batch's target count. A
                # plain SUM (with a post-division by 1) because gloo has no PREMUL_SUM, FSDP's op for a factor.
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)
                unit.set_reduce_scatter_unused_params(True)  # experts unrouted on this rank: zeros, same collectives
        owners = [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
        if owners or self.root is None:  # the model being trained (a frozen teacher's root is only `call`ed)
            self.root, self._owners = root, owners
            for m in owners:
                m.register_forward_pre_hook(self._mark_used)
        params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
        return [(n, params[n] if n in params else buffers[n]) for n, _ in named]

    def _mark_used(self, module, _args) -> None:
        if self._recording:
            self._used.add(module)

    def _drop_unused_grads(self) -> None:
        """A parameter that no rank's real rows reached (a routed expert no token chose) has no gradient in one
        process, so AdamW leaves it alone; FSDP gave it zeros (set_reduce_scatter_unused_params), on which AdamW
        would still move it by its momentum. Its gradient goes back to None."""
        used = torch.tensor([m in self._used for m in self._owners], dtype=torch.int32, device=self.device)
        td.all_reduce(used, op=td.ReduceOp.MAX)
        for m, u in zip(self._owners, used.tolist(), strict=True):
            if not u:
                for p in m.parameters(recurse=False):
                    p.grad = None

    def gather(self, model, trained_only: bool) -> dict | None:
        """The sharded model's state dict whole, on CPU, on rank 0 (None on the others; every rank must call
        it): for the adapter (`trained_only`: the LoRA factors) or the fine-tuned checkpoint."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # ~2 s: FSDP only

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trained_only)
        state = get_model_state_dict(model, options=opts)
        return state if self.is_main else None

    # ---- the data -----------------------------------------------------------------------------------------
    def rows(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share [start, stop) of a batch's `n` rows (torch.tensor_split's division)."""
        q, r = divmod(n, self.world_size)
        start = self.rank * q + min(self.rank, r)
        return start, start + q + (self.rank < r)

    def backward(self, batch, micro_batch: int, loss_of: Callable[[object], LossTerms]) -> LossTerms:
        """Backpropagate this rank's rows of the global `batch` (ids, mask, ...): `loss_of(micro)` must divide by
        the global batch's target count. Every rank runs as many micro-batches as the rank with the most rows
        (the others' extra ones are empty). -> the global batch's loss (summed over the ranks), on every rank."""
        parts = batch if isinstance(batch, tuple) else (batch,)
        n = parts[0].shape[0]
        start, stop = self.rows(n)
        per = micro_batch if micro_batch > 0 else -(-n // self.world_size)
        mine = tuple(x[start:stop].to(self.device) for x in parts)
        micros = micro_batches(mine, per) if stop > start else []
        # an empty micro-batch: one row of two tokens with no target (its two tokens are not data)
        empty = tuple(x[:1, :2].to(self.device) for x in parts[:1]) + _no_targets(parts, self.device)

        def step(micro) -> LossTerms:
            if micro is None:
                out = self.call(loss_of, empty)
                return LossTerms(out.loss, out.lm, out.mtp, out.tokens - 2)
            return self.call(loss_of, micro)

        return self.lockstep([(micros, step)])

    def call(self, fn: Callable, arg, model=None):
        """`fn(arg)` inside the FSDP root's forward of `model` (default the trained one), so that the root's own
        parameters (embeddings, final norm, lm_head) are gathered: a recipe that calls `model.model` and
        `model.lm_head` itself, or samples, never runs the model's forward. Collective: every rank calls it."""
        root = self.root if model is None else self._roots[id(model)]
        out = root(fn, arg)
        return out[1] if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], LossTerms) else out

    def lockstep(self, parts: list[tuple[list, Callable[[object | None], LossTerms]]]) -> LossTerms:
        """For each (items, loss_of) of `parts` in turn: backpropagate `loss_of(item)` for each of this rank's items,
        then `loss_of(None)` until this rank has run as many as the rank with the most. `loss_of(None)` must make
        the same collectives with nothing of the data (an empty micro-batch, a dummy forward) and a loss of exactly
        0; one part's forwards must be the same models' on every rank (a part per teacher). Trained modules that
        only those dummies reached get no gradient (see `_drop_unused_grads`). -> the sums over every rank's items
        (lm, tokens, mtp)."""
        self._used = set()
        outs = []
        for mine, loss_of in parts:
            count = self.max_int(len(mine))

            def run(i: int, mine=mine, loss_of=loss_of) -> LossTerms:
                self._recording = i < len(mine)
                return loss_of(mine[i] if i < len(mine) else None)

            if count:
                outs.append(backward_each(list(range(count)), run))
        self._recording = False
        self._drop_unused_grads()
        lm, tokens = sum(o.lm for o in outs), sum(o.tokens for o in outs)
        mtp = [sum(x) for x in zip(*(o.mtp for o in outs), strict=True)] if outs else []
        totals = torch.tensor([lm, float(tokens), *mtp], dtype=torch.float64, device=self.device)
        td.all_reduce(totals)
        lm, tokens, *mtp = totals.tolist()
        return LossTerms(torch.tensor(lm), lm, mtp, int(tokens))

    def max_int(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64, device=self.device)
        td.all_reduce(t, op=td.ReduceOp.MAX)
        return int(t)

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on some rank (collective)."""
        return self.max_int(int(flag)) > 0

    def sum(self, x: float) -> float:
        return float(self.all_sum(torch.tensor([x], dtype=torch.float64)))

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks (collective), on the CPU."""
        t = t.to(self.device)
        td.all_reduce(t)
        return t.cpu()


class _LossRoot(torch.nn.Module):
    """The FSDP root: `root(loss_of, batch)` runs the recipe's loss function inside the root's forward. FSDP
    gathers a unit's parameters in that unit's forward hook, and the losses (sft_loss, mtp_loss) call
    `model.model` and `model.lm_head` rather than the model's forward (only the target rows reach the lm_head),
    so the model's own forward would never run and its root parameters would stay sharded."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, fn, batch):
        out = fn(batch)
        if isinstance(out, LossTerms):
            return out.loss, out  # the loss tensor out in the open: FSDP hooks the root's backward on it
        return out


def _untie_experts(model) -> None:
    """Give every expert its own contiguous weights. The MoE keeps its experts' weights as transposed views of
    two stacked tensors (moe.tie_experts: one grouped GEMM at inference), which FSDP cannot shard
    (non-contiguous), and the stacks would stay a whole second copy on every rank. Training runs the per-expert
    path anyway (autograd must reach each expert's parameters), which needs no tie."""
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is not None and not p.is_contiguous():
                m._parameters[name] = nn.Parameter(p.detach().contiguous(), requires_grad=p.requires_grad)
        if isinstance(m, MoE):
            m._gate_up = m._down = None
            m._tied_ptrs = []


def _no_targets(parts: tuple, device) -> tuple:
    """The rest of an empty micro-batch: the mask all False (no target), any other tensor's first row."""
    rest = tuple(x[:1, :2].to(device) for x in parts[2:])
    return (torch.zeros(1, 2, dtype=torch.bool, device=device),) + rest if len(parts) > 1 else rest
