"""INT4 weight-only quantization: group-wise int4 weights, activations in the compute dtype (W4A16).

`quantize_int4(model, group_size=128)` swaps every `nn.Linear` not matched by `skip` for an `Int4Linear`,
the way gpt-fast's `quantize.py` does: the model code stays written for full-precision weights.

The layer is `Int4Linear` (model/int4_linear.py), its numerics model/int4_numerics.py; MLP gate / up pairs are
fused after the swap (model/int4_gate_up.py). Checkpoints: model/int4_load.py reads a compressed-tensors one into
a model, model/int4_write.py writes one from an unquantized checkpoint.

What stays in high precision follows GLM-5's FP8 checkpoint (reference glm5-model.md §2): embeddings and norms
(not `nn.Linear`, never touched), `lm_head`, the MoE router `mlp.gate`, the MTP `eh_proj` and the DSA indexer's
`weights_proj`; plus the indexer's `wk`, which vLLM fuses with `weights_proj` into an unquantized layer.
`DEFAULT_SKIP` lists them as regexes; pass your own `skip` to change it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from model.int4_gate_up import fuse_gate_up
from model.int4_linear import GROUP_SIZES, Int4Linear
from model.int4_numerics import fake_quantize_weight

# Regexes (re.search on the full module name) of linears kept in high precision, after GLM-5-FP8's split.
DEFAULT_SKIP: tuple[str, ...] = (
    r"(^|\.)lm_head$",
    r"(^|\.)mlp\.gate$",  # MoE router: scores are sigmoid-ed and top-k'd, keep them exact
    r"(^|\.)indexer\.weights_proj$",  # DSA indexer head weights (BF16 even in GLM-5-FP8)
    # FP8 in GLM-5-FP8, but vLLM fuses wk + weights_proj into one *unquantized* wk_weights_proj (it upcasts
    # FP8 wk to BF16 on load), so an int4 wk would make the checkpoint unloadable there. 0.8M params a layer.
    r"(^|\.)indexer\.wk$",
    r"(^|\.)eh_proj$",  # MTP input projection (BF16 in GLM-5-FP8)
    r"(^|\.)shared_head\.head$",
)


def is_skipped(name: str, skip: Iterable[str]) -> bool:
    """Whether the module `name` stays in high precision under the regexes `skip`."""
    return any(re.search(p, name) for p in skip)


def quantize_int4(
    model: nn.Module,
    group_size: int = 128,
    symmetric: bool = True,
    skip: Iterable[str] = DEFAULT_SKIP,
    impl: str = "fast",
    strict: bool = True,
    mse: bool = True,
) -> nn.Module:
    """Swap every `nn.Linear` of `model` whose name no `skip` regex matches for an `Int4Linear`, in place.

    Move the model to its device first: the fast layout is built for the device the weights are on.
    Returns the model. A linear whose in_features is not a multiple of `group_size` raises a ValueError naming
    it, or with `strict=False` stays in high precision (as `quantize_checkpoint` does).
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    targets = _targets(model, group_size, skip, strict)
    for name, mod in targets:
        if mod.in_features % group_size:
            raise ValueError(
                f"{name}: in_features {mod.in_features} is not a multiple of group_size {group_size}; "
                "pick a smaller group size or add the layer to skip"
            )
    for name, mod in targets:
        set_submodule(model, name, Int4Linear.from_linear(mod, group_size, symmetric, impl, mse))
    fuse_gate_up(model)
    return model


def _targets(model: nn.Module, group_size: int, skip: Iterable[str], strict: bool) -> list[tuple[str, nn.Linear]]:
    """The linears `quantize_int4` swaps: not skipped (with strict=False, only those it can group)."""
    skip = tuple(skip)
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not isinstance(mod, Int4Linear) and not is_skipped(name, skip)
    ]
    return targets if strict else [(name, mod) for name, mod in targets if mod.in_features % group_size == 0]


@torch.no_grad()
def round_like_int4(model: nn.Module, group_size: int = 128, skip: Iterable[str] = DEFAULT_SKIP) -> list[str]:
    """Replace, in place, the weight of every linear `quantize_int4(model, group_size, strict=False)` would swap
    with the weight its Int4Linear multiplies by (`fake_quantize_weight`), in full precision: a model that
    computes what the INT4-served one does, and can still be trained. `glm5 finetune rl --quant int4` trains a
    LoRA adapter on top of it, the adapter served beside the int4 weights. -> the names rounded."""
    names = []
    for name, mod in _targets(model, group_size, skip, strict=False):
        mod.weight.copy_(fake_quantize_weight(mod.weight, group_size, symmetric=True, mse=True))
        names.append(name)
    return names


def set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule at dotted `name` (works for ModuleList indices too)."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Weight storage of a model by kind: `int4` (Int4Linear buffers incl. scales) and `dense` (parameters)."""
    int4 = sum(m.weight_bytes() for m in model.modules() if isinstance(m, Int4Linear))
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"int4": int4, "dense": dense, "total": int4 + dense}
