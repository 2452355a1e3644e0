"""Weight fusion for the runner's fast path, declared once: several linears that read the same input become one.

Per decoder layer:
  w_in      [Q + C + R + Di, D]  q_a_proj | kv_a_proj_with_mqa | indexer.wk   (all read the normed hidden)
  gate_up   [2I, D] per expert, shared expert and dense MLP: gate_proj | up_proj
Every fused weight, and the other linears of a layer (q_b_proj, o_proj, indexer.wq_b, down_proj) and the
lm_head, is stored input-major ([in, out]; the linear's weight is its transposed view): see `_fuse`.
Routed experts whose weights already live in the MoE's own input-major stack (`MoE.tie_experts`) are not fused
again: their gate_up is a transposed view of that stack, so the experts' weights exist once in memory.
The model's own parameters are re-pointed to row slices of the fused tensors (storage is shared, nothing is
copied), so the model, its checkpoint names, `load_state_dict` (which copies in place) and the plain path
are unchanged. If something replaces a parameter tensor afterwards (`model.to(dtype)`, a module swap), the
fusion no longer aliases it; `is_current` notices and the runner fuses again.

On a batch-1 decode step on CPU each linear costs as much in dispatch as in arithmetic, so fewer, larger
matrix-vector products are faster while reading the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def _fuse(linears: list[nn.Linear]) -> torch.Tensor | None:
    """Concatenate the weights along the output dim, stored input-major, and re-point each linear to its
    slice. Returns the fused [out, in] weight, a transposed view of [in, out] storage. None if any has a
    bias or they differ in dtype/device (then the fast path calls them one by one).

    Input-major: `F.linear` with this weight is one GEMM over contiguous [in, out] rows (MKL "NN"). On CPU,
    for the 1-16 rows of a decode step, that runs up to 1.5x faster than from the checkpoint's [out, in]
    rows (measured, 1 thread: 768x512 at 16 rows 0.12 vs 0.18 ms; 8192x768 2.4 vs 3.0 ms) and is never
    slower, including 512-row prefill chunks. The MoE's expert stacks use the same layout (model/moe.py)."""
    if not all(type(lin) is nn.Linear for lin in linears):  # e.g. LoRA or INT4 modules: leave them alone
        return None
    ws = [lin.weight for lin in linears]
    if any(getattr(lin, "bias", None) is not None for lin in linears) or len({(w.dtype, w.device) for w in ws}) > 1:
        return None
    if len(ws) == 1 and _input_major(ws[0]):
        return ws[0]  # already a transposed view of input-major storage (an earlier fusion, or the MoE stack)
    fused_T = torch.cat([w.detach().T for w in ws], dim=1)  # [in, sum(out)]
    start = 0
    for lin, w in zip(linears, ws, strict=True):
        lin.weight.data = fused_T[:, start : start + w.shape[0]].T
        start += w.shape[0]
    return fused_T.T


def _input_major(w: torch.Tensor) -> bool:
    return w.dim() == 2 and w.stride(0) == 1 and w.stride(1) >= w.shape[0]


@dataclass
class FusedLayer:
    w_in: torch.Tensor | None  # None: the layer has a 'shared' indexer (no wk), or biases; not fused
    gate_up: list[torch.Tensor | None]  # routed experts (MoE) or [dense MLP]
    shared_gate_up: torch.Tensor | None
    probe: nn.Linear  # a fused linear whose weight must still alias w_in / gate_up[0]
    # The routed experts still view the MoE's stack (`MoE._stacked_ok()` at fusion time, checked once here
    # rather than per step: the check walks every expert). `expert_probe` (expert 0: module swaps such as INT4
    # or LoRA replace every expert) must still alias the stack.
    stacked: bool = False
    expert_probe: nn.Linear | None = None
    watched: tuple = ()  # `_watched(layer)` at fusion time

    def is_current(self) -> bool:
        if any(mods[name] is not mod for mods, name, mod in self.watched):
            return False  # a module was swapped (INT4, LoRA): fuse again
        ref = self.w_in if self.w_in is not None else self.gate_up[0]
        if ref is None:
            return True  # nothing fused (INT4 or LoRA modules throughout), and the modules are the same
        if self.probe.weight.data_ptr() != ref.data_ptr():
            return False
        return self.expert_probe is None or self.expert_probe.weight.data_ptr() == self.gate_up[0].data_ptr()


def _watched(layer) -> tuple[tuple[dict, str, nn.Module], ...]:
    """The modules whose replacement changes what can be fused, as (their parent's module dict, name, module):
    `is_current` compares them by identity with dict lookups only (~1 us a layer; a batch-1 step of a small
    model checks every layer, and the MTP layer once per pass). A swap (quantize_int4, peft's injection)
    replaces the entry in that same dict. Without this check a layer whose linears are all INT4 or LoRA
    modules (nothing fused) looked stale at every step and was fused again each time: ~1.1 ms per decode step
    on `small`; and a LoRA module injected after fusion, whose `.weight` is its base's, went unnoticed."""
    attn, mlp = layer.self_attn, layer.mlp
    experts = mlp._modules.get("experts")
    first = experts[0] if experts is not None else mlp
    shared = mlp._modules.get("shared_experts") or first
    slots = [(attn._modules, n) for n in ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj")]
    slots += [(first._modules, n) for n in ("gate_proj", "up_proj", "down_proj")]
    slots += [(shared._modules, "gate_proj")] + ([(experts._modules, "0")] if experts is not None else [])
    return tuple((mods, name, mods[name]) for mods, name in slots)


# Fusion runs from inside the runner's inference_mode, but the tensors it makes become the model's parameters:
# they must be ordinary tensors (inference_mode(False)), or training the same model later (RL: rollouts with
# the engine, then an optimizer step) fails on inference tensors.


@torch.inference_mode(False)
@torch.no_grad()
def fuse_head(lm_head: nn.Linear) -> None:
    """The lm_head, input-major (its weight becomes a transposed view; nothing else changes)."""
    _fuse([lm_head])


@torch.inference_mode(False)
@torch.no_grad()
def fuse_layer(layer) -> FusedLayer:
    attn, mlp = layer.self_attn, layer.mlp
    w_in = None
    if attn.indexer is not None:
        w_in = _fuse([attn.q_a_proj, attn.kv_a_proj_with_mqa, attn.indexer.wk])
        _fuse([attn.indexer.wq_b])
    # Linears the fast path calls on their own: stored input-major as well (see _fuse).
    down = mlp.shared_experts.down_proj if hasattr(mlp, "experts") else mlp.down_proj
    for lin in (attn.q_b_proj, attn.o_proj, down):
        _fuse([lin])
    stacked = False
    if hasattr(mlp, "experts"):
        stacked = mlp._stacked_ok()
        if stacked:  # views of the model's [E, D, 2I] stack: no second copy of the experts
            gate_up = [mlp._gate_up[e].T for e in range(len(mlp.experts))]
        else:
            gate_up = [_fuse([e.gate_proj, e.up_proj]) for e in mlp.experts]
        shared = _fuse([mlp.shared_experts.gate_proj, mlp.shared_experts.up_proj])
        first = mlp.experts[0].gate_proj
    else:
        gate_up, shared, first = [_fuse([mlp.gate_proj, mlp.up_proj])], None, mlp.gate_proj
    probe = attn.q_a_proj if w_in is not None else first
    return FusedLayer(
        w_in,
        gate_up,
        shared,
        probe,
        stacked=stacked,
        expert_probe=first if stacked and probe is not first else None,
        watched=_watched(layer),
    )
