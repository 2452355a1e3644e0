"""The compressed-tensors `pack-quantized` checkpoint format (W4A16), read and written without the library.

This is the format that vLLM and sglang load as `compressed-tensors` W4A16 and that public 4-bit GLM-5
checkpoints use. Per quantized linear `X` (weight `[N, K]`, `G = K / group_size` groups along the input dim):

    X.weight_packed      int32 [N, ceil(K/8)]  int4 values packed 8 per int32 along the input dim
    X.weight_scale       [N, G]                in the compute dtype (bf16 in public checkpoints)
    X.weight_shape       int64 [2]             the original [N, K]
    X.weight_zero_point  int32 [ceil(N/8), G]  asymmetric only: int4 zero points packed along the OUTPUT dim

Values are signed int4 `q` in [-8, 7], stored with a +8 offset as unsigned nibbles; element `k` of a row sits
in word `k // 8` at bits `4 * (k % 8)` (element 0 in the low nibble). Dequantisation is
`w = (q - zero_point) * scale`, the scale and zero point of group `k // group_size`; symmetric checkpoints
have no zero point (it is 0).

`config.json` carries a `quantization_config` block (`quant_method: compressed-tensors`,
`format: pack-quantized`, `config_groups` whose `weights` say num_bits 4 / type int / strategy group /
group_size / symmetric, `targets: ["Linear"]`, and an `ignore` list of modules left in high precision).

What this file does not know: modules, kernels (see `model/int4_linear.py`), or the GLM-5 network. Loading such
a checkpoint into a model is model/int4_load.py's; writing one from an unquantized checkpoint model/int4_write.py's.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

QUANT_METHOD = "compressed-tensors"
FORMAT = "pack-quantized"
# The compressed-tensors release whose serialisation we follow (written as `version`, informational only).
FORMAT_VERSION = "0.20.1"
PACK_FACTOR = 8  # int4 values per int32 word


class CompressedTensorsError(ValueError):
    """A checkpoint claims compressed-tensors but is not a W4A16 pack-quantized one we can load."""


# ---------------------------------------------------------------------------------------------------------------
# Packing. q_NK: int8 in [-8, 7]; packed_NW: int32 with W = ceil(K / 8) words.


def pack_int4(q: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Pack signed int4 values (int8 in [-8, 7]) 8 per int32 along `dim` (1: input dim; 0: output dim)."""
    if q.dtype != torch.int8 or q.ndim != 2:
        raise ValueError(f"pack_int4 expects a 2-D int8 tensor, got {q.dtype} {tuple(q.shape)}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError("pack_int4: values outside the int4 range [-8, 7]")
    u = (q.to(torch.int32) + 8).transpose(0, 1) if dim == 0 else (q.to(torch.int32) + 8)
    rows, cols = u.shape
    words = math.ceil(cols / PACK_FACTOR)
    u = torch.nn.functional.pad(u, (0, words * PACK_FACTOR - cols)).view(rows, words, PACK_FACTOR)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=q.device)
    # Nibbles never overlap, so the sum is a bitwise OR; int32 wraparound for the top nibble is the intent.
    packed = (u << shifts).sum(-1, dtype=torch.int32)
    return (packed.transpose(0, 1) if dim == 0 else packed).contiguous()


def unpack_int4(packed: torch.Tensor, size: int, dim: int = 1) -> torch.Tensor:
    """Inverse of `pack_int4`: `size` is the unpacked length along `dim`. Returns int8 in [-8, 7]."""
    if packed.dtype != torch.int32 or packed.ndim != 2:
        raise ValueError(f"unpack_int4 expects a 2-D int32 tensor, got {packed.dtype} {tuple(packed.shape)}")
    p = packed.transpose(0, 1) if dim == 0 else packed
    if p.shape[1] != math.ceil(size / PACK_FACTOR):
        raise ValueError(f"unpack_int4: {p.shape[1]} words cannot hold {size} int4 values")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    u = (p.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift, but the mask keeps only the nibble
    q = (u.reshape(p.shape[0], -1)[:, :size] - 8).to(torch.int8)
    return q.transpose(0, 1).contiguous() if dim == 0 else q


# ---------------------------------------------------------------------------------------------------------------
# The quantization_config block.


@dataclass(frozen=True)
class Int4Scheme:
    """One config group: int4 group-wise weights, activations left in the compute dtype."""

    group_size: int = 128
    symmetric: bool = True
    targets: tuple[str, ...] = ("Linear",)
    observer: str = "minmax"  # how the ranges were chosen ("minmax", or "mse": a clipping search); informational


@dataclass(frozen=True)
class QuantizationConfig:
    """The parts of `quantization_config` that decide how a module is stored."""

    groups: dict[str, Int4Scheme]
    ignore: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The block as llm-compressor / compressed-tensors serialise it for W4A16."""
        groups = {
            name: {
                "targets": list(s.targets),
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": s.symmetric,
                    "group_size": s.group_size,
                    "strategy": "group",
                    "dynamic": False,
                    "actorder": None,
                    "block_structure": None,
                    "observer": s.observer,
                    "observer_kwargs": {},
                },
                "input_activations": None,
                "output_activations": None,
                "format": FORMAT,
            }
            for name, s in self.groups.items()
        }
        return {
            "quant_method": QUANT_METHOD,
            "format": FORMAT,
            "quantization_status": "compressed",
            "config_groups": groups,
            "ignore": list(self.ignore),
            "kv_cache_scheme": None,
            "global_compression_ratio": None,
            "sparsity_config": {},
            "transform_config": {},
            "version": FORMAT_VERSION,
        }

    @classmethod
    def from_json(cls, block: dict) -> QuantizationConfig:
        """Validate a `quantization_config` block; anything but int4 group-wise W4A16 is a clear error."""
        if block.get("quant_method") != QUANT_METHOD:
            raise CompressedTensorsError(f"quant_method is {block.get('quant_method')!r}, expected {QUANT_METHOD!r}")
        fmt = block.get("format")
        groups: dict[str, Int4Scheme] = {}
        for name, g in (block.get("config_groups") or {}).items():
            w = g.get("weights") or {}
            where = f"quantization_config.config_groups.{name}"
            gfmt = g.get("format") or fmt
            if gfmt != FORMAT:
                raise CompressedTensorsError(f"{where}: format {gfmt!r} is not supported, only {FORMAT!r}")
            if g.get("input_activations") is not None:
                raise CompressedTensorsError(f"{where}: activation quantization is not supported (only W4A16)")
            if w.get("num_bits") != 4 or w.get("type", "int") != "int":
                raise CompressedTensorsError(
                    f"{where}: weights are {w.get('type')} {w.get('num_bits')}-bit; only int 4-bit is supported"
                )
            if w.get("strategy") != "group" or not w.get("group_size"):
                raise CompressedTensorsError(
                    f"{where}: strategy {w.get('strategy')!r} is not supported; only 'group' with a group_size"
                )
            if w.get("actorder") not in (None, "static"):
                raise CompressedTensorsError(f"{where}: actorder {w['actorder']!r} (weight_g_idx) is not supported")
            groups[name] = Int4Scheme(
                int(w["group_size"]), bool(w.get("symmetric", True)), tuple(g["targets"]), w.get("observer") or "minmax"
            )
        if not groups:
            raise CompressedTensorsError("quantization_config has no config_groups")
        return cls(groups=groups, ignore=tuple(block.get("ignore") or ()))

    def scheme_for(self, module_name: str, class_names: tuple[str, ...] = ("Linear",)) -> Int4Scheme | None:
        """The scheme that covers `module_name` (compressed-tensors matching: exact name, `re:` regex or class
        name), or None when no group targets it or it is ignored."""
        if any(_matches(module_name, t, class_names) for t in self.ignore):
            return None
        for scheme in self.groups.values():
            if any(_matches(module_name, t, class_names) for t in scheme.targets):
                return scheme
        return None


def _matches(name: str, target: str, class_names: tuple[str, ...]) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or target in class_names


def read_quantization_config(ckpt_dir: str | Path) -> QuantizationConfig | None:
    """The checkpoint's compressed-tensors config, or None for an unquantized checkpoint."""
    cfg = json.loads((Path(ckpt_dir) / "config.json").read_text())
    block = cfg.get("quantization_config")
    if block is None:
        return None
    if block.get("quant_method") != QUANT_METHOD:
        raise CompressedTensorsError(
            f"{ckpt_dir}: quantization_config.quant_method {block.get('quant_method')!r} is not supported; "
            f"glm5 loads {QUANT_METHOD!r} ({FORMAT}) checkpoints"
        )
    return QuantizationConfig.from_json(block)


# ---------------------------------------------------------------------------------------------------------------
# Module state <-> checkpoint tensors.


@dataclass
class Int4Tensors:
    """One quantized linear in unpacked form: `w ~= (q - zero_point) * scale` per group."""

    q: torch.Tensor  # int8 [N, K] in [-8, 7]
    scale: torch.Tensor  # [N, G]
    zero_point: torch.Tensor | None  # int8 [N, G] in [-8, 7]; None when symmetric
    group_size: int


def compress(t: Int4Tensors, scale_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of one module (local names: `weight_packed`, ...); scales keep their dtype
    unless `scale_dtype` is given."""
    out = {
        "weight_packed": pack_int4(t.q, dim=1),
        "weight_scale": t.scale.to(scale_dtype or t.scale.dtype).contiguous(),
        "weight_shape": torch.tensor(list(t.q.shape), dtype=torch.int64),
    }
    if t.zero_point is not None:
        out["weight_zero_point"] = pack_int4(t.zero_point, dim=0)
    return out


def decompress(tensors: dict[str, torch.Tensor], scheme: Int4Scheme, where: str = "") -> Int4Tensors:
    """Unpack one module's checkpoint tensors (local names), checking every shape against `weight_shape`."""
    try:
        packed, scale = tensors["weight_packed"], tensors["weight_scale"]
        n, k = (int(v) for v in tensors["weight_shape"].tolist())
    except KeyError as e:
        raise CompressedTensorsError(f"{where}: missing tensor {where}.{e.args[0]}") from None
    groups = math.ceil(k / scheme.group_size)
    if tuple(packed.shape) != (n, math.ceil(k / PACK_FACTOR)) or packed.dtype != torch.int32:
        raise CompressedTensorsError(
            f"{where}.weight_packed: {packed.dtype} {tuple(packed.shape)}, expected int32 {(n, math.ceil(k / 8))}"
        )
    if tuple(scale.shape) != (n, groups):
        raise CompressedTensorsError(f"{where}.weight_scale: shape {tuple(scale.shape)}, expected {(n, groups)}")
    zp = None
    if not scheme.symmetric:
        if "weight_zero_point" not in tensors:
            raise CompressedTensorsError(f"{where}: asymmetric scheme but no {where}.weight_zero_point")
        zp_packed = tensors["weight_zero_point"]
        if tuple(zp_packed.shape) != (math.ceil(n / PACK_FACTOR), groups):
            raise CompressedTensorsError(
                f"{where}.weight_zero_point: shape {tuple(zp_packed.shape)}, expected {(math.ceil(n / 8), groups)}"
            )
        zp = unpack_int4(zp_packed, n, dim=0)
    return Int4Tensors(unpack_int4(packed, k, dim=1), scale, zp, scheme.group_size)


def packed_modules(names: Iterable[str]) -> set[str]:
    """Module names that carry `weight_packed` among checkpoint tensor names."""
    return {n[: -len(".weight_packed")] for n in names if n.endswith(".weight_packed")}


def read_tensors(ckpt_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors checkpoint directory, by name."""
    files = sorted(Path(ckpt_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {ckpt_dir}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
