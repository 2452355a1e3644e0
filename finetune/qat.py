"""INT4 quantization-aware training (QAT): train the full-precision weights through the INT4 rounding that serving
will apply, so the served INT4 model is the model that was trained.

    quantized = apply_qat(model, QATSettings(group_size=128))   # swap the linears an INT4 checkpoint quantizes
    train_sft(model, seqs, cfg, named=prepare_full(model))       # the ordinary loop: nothing else changes
    remove_qat(model)                                             # plain nn.Linear again, same parameters
    write_int4_checkpoint(fp_dir, out, settings)                  # what `glm5 serve` loads

Numerics: an `Int4FakeQuantLinear` multiplies by `model.int4_numerics.fake_quantize_weight(W)`, the very function
(group-wise symmetric int4, MSE range search, scales in the weight's dtype) that `glm5 model quantize` and
`quantize_int4` use, so what trains and what is served cannot drift. The rounding has no useful gradient (zero
almost everywhere), so the backward is straight-through: d/dW of the fake-quantized matmul is taken as if the
rounding were the identity (`W + (Q(W) - W).detach()`), the rule of the QAT literature and torchao.

Which linears: those `quantize_checkpoint` quantizes (not in DEFAULT_SKIP, in_features a multiple of the group
size); the rest stay full precision in the INT4 checkpoint and train as usual here. The swap keeps each
linear's `weight` / `bias` Parameter objects, so names, optimizer state and checkpoints are unchanged.
With LoRA (peft layers from finetune/lora.py) what INT4 stores is the merged weight W + scaling * B A, so a
LoRA layer's forward fake-quantizes that merge (`_lora_qat_forward`) and the gradient reaches A and B.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model.int4_linear import GROUP_SIZES
from model.int4_numerics import fake_quantize_weight
from model.int4_write import quantize_checkpoint
from model.quant_int4 import DEFAULT_SKIP, is_skipped, set_submodule

QAT_SCHEMES = ("int4",)


@dataclass(frozen=True)
class QATSettings:
    """The INT4 scheme to train for: the one the checkpoint will be written with (`glm5 model quantize`'s
    --group-size; `glm5 serve --quant int4` quantizes with 128)."""

    group_size: int = 128
    symmetric: bool = True
    mse: bool = True  # the 'mse' observer, `glm5 model quantize`'s default
    skip: tuple[str, ...] = DEFAULT_SKIP

    def __post_init__(self) -> None:
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"INT4 group size must be one of {GROUP_SIZES}, got {self.group_size}")


class Int4FakeQuantLinear(nn.Linear):
    """An nn.Linear whose forward multiplies by its weight as INT4 will store it, with a straight-through
    gradient to the full-precision weight."""

    def __init__(self, linear: nn.Linear, s: QATSettings) -> None:
        nn.Module.__init__(self)  # no fresh weights: the linear's own Parameters are taken over below
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.settings = s

    def quantized_weight(self) -> torch.Tensor:
        """Q(W) in the forward, the identity in the backward (straight-through)."""
        w = self.weight
        with torch.no_grad():
            q = fake_quantize_weight(w.detach(), self.settings.group_size, self.settings.symmetric, self.settings.mse)
        return w + (q - w).detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.quantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, int4 fake-quant group_size={self.settings.group_size}"


def _lora_qat_forward(self, x: torch.Tensor) -> torch.Tensor:
    """A peft LoRA linear's forward under QAT: the weight it will be merged into, W + scaling * B A (peft's own
    merge formula), fake-quantized with a straight-through gradient, which reaches A and B through the merge."""
    (name,) = self.active_adapters
    base = self.base_layer
    merged = base.weight + (self.lora_B[name].weight @ self.lora_A[name].weight) * self.scaling[name]
    with torch.no_grad():
        q = fake_quantize_weight(merged.detach(), *self._qat.scheme)
    return F.linear(x, merged + (q - merged).detach(), base.bias)


class _LoraQAT:
    """What `apply_qat` keeps on a peft LoRA layer: the scheme, read by `_lora_qat_forward`."""

    def __init__(self, s: QATSettings) -> None:
        self.scheme = (s.group_size, s.symmetric, s.mse)


def qat_targets(model: nn.Module, s: QATSettings) -> list[str]:
    """The linears an INT4 checkpoint of `model` quantizes (`quantize_checkpoint`'s rule), by name."""
    out = []
    for name, mod in model.named_modules():
        lora = hasattr(mod, "base_layer") and type(mod.base_layer) is nn.Linear  # a peft LoRA layer: its merge
        inside_lora = name.endswith(".base_layer") or ".lora_" in name  # its parts: the layer itself counts
        if (type(mod) is nn.Linear and not inside_lora) or lora:
            lin = mod.base_layer if lora else mod
            if not is_skipped(name, s.skip) and lin.in_features % s.group_size == 0:
                out.append(name)
    return out


def apply_qat(model: nn.Module, s: QATSettings = QATSettings(), names: Iterable[str] | None = None) -> list[str]:
    """Swap those linears (or `names`) for `Int4FakeQuantLinear`s, in place. -> the names swapped."""
    names = list(qat_targets(model, s) if names is None else names)
    if not names:
        raise ValueError(
            f"no linear layer has in_features divisible by the INT4 group size {s.group_size}: nothing would be "
            "quantized; choose a smaller group size"
        )
    import types

    for name in names:
        mod = model.get_submodule(name)
        if hasattr(mod, "base_layer"):  # peft LoRA: its own forward replaced, its class and state untouched
            if len(mod.active_adapters) != 1 or not isinstance(mod.lora_dropout[mod.active_adapters[0]], nn.Identity):
                raise ValueError(f"{name}: QAT takes one active LoRA adapter, without dropout")
            mod._qat = _LoraQAT(s)
            mod.forward = types.MethodType(_lora_qat_forward, mod)
        else:
            set_submodule(model, name, Int4FakeQuantLinear(mod, s))
    return names


def remove_qat(model: nn.Module) -> int:
    """Back to plain nn.Linear layers holding the same (trained, full-precision) Parameters. -> how many."""
    lora = [m for m in model.modules() if "_qat" in m.__dict__]
    for mod in lora:
        del mod.forward, mod._qat  # back to the class's forward
    swapped = [(n, m) for n, m in model.named_modules() if isinstance(m, Int4FakeQuantLinear)]
    for name, mod in swapped:
        lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="meta")
        lin.weight, lin.bias = mod.weight, mod.bias
        set_submodule(model, name, lin)
    return len(swapped) + len(lora)


def write_int4_checkpoint(fp_checkpoint: Path, out: Path, s: QATSettings) -> dict:
    """The QAT-trained checkpoint as compressed-tensors W4A16 with the trained scheme (`glm5 model quantize`'s
    writer): the weights `glm5 serve OUT` multiplies by are the ones the training forward used. -> its summary."""
    return quantize_checkpoint(fp_checkpoint, out, s.group_size, s.symmetric, s.skip, mse=s.mse)
