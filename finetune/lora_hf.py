"""Our LoRA adapter in transformers' layout: what `peft.PeftModel.from_pretrained(GlmMoeDsaForCausalLM, dir)` loads.

    export_hf_adapter(out / "adapter", out / "adapter_hf")    # file to file; no model, no transformers needed

Ours (finetune/lora.py) puts LoRA on per-expert `nn.Linear`s (`mlp.experts.{e}.gate_proj`, ...). transformers
fuses the routed experts into two 3-D parameters, `mlp.experts.gate_up_proj` [E, 2I, D] (gate rows, then up
rows) and `mlp.experts.down_proj` [E, D, I], which peft adapts with `target_parameters` (lora.ParamWrapper).
A ParamWrapper of rank R on an E-expert parameter keeps one (A_e [R, in], B_e [out, R]) pair per expert:
    lora_A.weight [E*R, in]   row e*R + j   = A_e[j]
    lora_B.weight [out, R*E]  column j*E + e = B_e[:, j]
so per-expert LoRA is represented exactly. gate and up share one fused parameter: rank 2r with
A = [A_gate; A_up] and B = [[B_gate, 0], [0, B_up]] gives [B_gate A_gate; B_up A_up], and alpha 2*alpha keeps
the scaling alpha/r (rank_pattern / alpha_pattern). peft nests the two wrappers of one `experts` module with
gate_up_proj inside: its keys are `experts.base_layer.lora_*`, down_proj's `experts.lora_*`.

Why the dense MLPs and shared experts are `target_parameters` too (their `weight`, a 2-D ParamWrapper whose
keys and math equal a LoRA Linear's): with transformers v5, peft rewrites any `target_modules` entry named
gate_proj / up_proj / down_proj to the fused experts (its conversion of v4 adapters), which would drop their
LoRA. Attention projections stay `target_modules`, by full name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PREFIX = "base_model.model."
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(lora_[AB])\.weight$")
_MLP = re.compile(r"^(model\.layers\.\d+\.mlp(?:\.shared_experts)?)\.(gate_proj|up_proj|down_proj)\.lora_[AB]\.weight$")
_ANY = re.compile(r"^(.+)\.lora_[AB]\.weight$")


def fuse_experts(factors: dict[tuple[int, str, str], torch.Tensor], n_experts: int, r: int) -> dict[str, torch.Tensor]:
    """One layer's per-expert factors {(e, proj, 'lora_A'|'lora_B'): tensor} -> the two ParamWrappers' tensors,
    keyed 'base_layer.lora_A' (gate_up, rank 2r) ... 'lora_B' (down, rank r). A projection without LoRA
    (not among the targets) contributes zeros: the same delta."""

    def get(e: int, proj: str, ab: str, shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
        t = factors.get((e, proj, ab))
        return t if t is not None else like.new_zeros(shape)

    like = next(iter(factors.values()))
    # D (hidden) and I (the expert's intermediate size) from whichever factors exist.
    hidden = inter = 0
    for (_, proj, ab), t in factors.items():
        if proj == "down_proj":
            hidden, inter = (t.shape[0], inter) if ab == "lora_B" else (hidden, t.shape[1])
        else:
            hidden, inter = (hidden, t.shape[0]) if ab == "lora_B" else (t.shape[1], inter)
    projs = {p for _, p, _ in factors}
    out: dict[str, torch.Tensor] = {}
    if projs & {"gate_proj", "up_proj"}:
        a = torch.stack(  # [E, 2r, D]
            [
                torch.cat([get(e, p, "lora_A", (r, hidden), like) for p in ("gate_proj", "up_proj")])
                for e in range(n_experts)
            ]
        )
        b = torch.stack(  # [E, 2I, 2r], block-diagonal per expert
            [
                torch.block_diag(*[get(e, p, "lora_B", (inter, r), like) for p in ("gate_proj", "up_proj")])
                for e in range(n_experts)
            ]
        )
        out["base_layer.lora_A"] = a.reshape(n_experts * 2 * r, hidden)
        out["base_layer.lora_B"] = b.permute(1, 2, 0).reshape(2 * inter, 2 * r * n_experts)  # column j*E + e
    if "down_proj" in projs:
        a = torch.stack([get(e, "down_proj", "lora_A", (r, inter), like) for e in range(n_experts)])  # [E, r, I]
        b = torch.stack([get(e, "down_proj", "lora_B", (hidden, r), like) for e in range(n_experts)])  # [E, D, r]
        # down is the outer wrapper; without gate/up LoRA it is the only one and still sits directly on `experts`.
        out["lora_A"] = a.reshape(n_experts * r, inter)
        out["lora_B"] = b.permute(1, 2, 0).reshape(hidden, r * n_experts)
    return out


def export_hf_adapter(src: Path, dst: Path, n_routed_experts: int | None = None) -> Path:
    """Write the transformers-layout copy of the adapter at `src` (save_adapter's) to `dst`. `n_routed_experts`:
    default the highest expert index in the adapter + 1 (every routed expert has LoRA when its projections are
    targets). -> dst."""
    src, dst = Path(src), Path(dst)
    if not (src / "adapter_config.json").is_file():
        raise ValueError(f"{src} has no adapter_config.json: not a peft adapter (save_adapter writes one)")
    cfg = json.loads((src / "adapter_config.json").read_text())
    if cfg.get("target_parameters"):
        raise ValueError(f"{src} already targets parameters (a transformers-layout adapter?): nothing to convert")
    r, alpha = int(cfg["r"]), cfg["lora_alpha"]
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise ValueError(f"{src} has per-module ranks (rank_pattern/alpha_pattern), which this export does not map")
    state = load_file(str(src / "adapter_model.safetensors"))

    experts: dict[str, dict[tuple[int, str, str], torch.Tensor]] = {}
    tensors: dict[str, torch.Tensor] = {}
    modules: set[str] = set()  # attention projections: target_modules
    params: set[str] = set()  # fused experts and MLP linears: target_parameters
    for key, t in state.items():
        name = key.removeprefix(PREFIX)
        if m := _EXPERT.match(name):
            experts.setdefault(m[1], {})[(int(m[2]), m[3], m[4])] = t
        elif m := _MLP.match(name):
            tensors[PREFIX + name] = t  # a 2-D ParamWrapper's keys are a LoRA Linear's
            params.add(f"{m[1]}.{m[2]}.weight")
        elif m := _ANY.match(name):
            tensors[PREFIX + name] = t
            modules.add(m[1])
        else:
            raise ValueError(f"{src}: unexpected tensor {key} (only LoRA A/B weights are exported)")
    n_max = max((e for f in experts.values() for e, _, _ in f), default=-1) + 1
    n_experts = n_routed_experts or n_max
    if n_experts < n_max:
        raise ValueError(f"n_routed_experts={n_experts} but the adapter has LoRA on expert {n_max - 1}")
    for mod, factors in experts.items():
        for suffix, t in fuse_experts(factors, n_experts, r).items():
            tensors[f"{PREFIX}{mod}.{suffix}.weight"] = t.contiguous()
        projs = {p for _, p, _ in factors}
        params |= {f"{mod}.gate_up_proj"} if projs & {"gate_proj", "up_proj"} else set()
        params |= {f"{mod}.down_proj"} if "down_proj" in projs else set()

    out_cfg = dict(cfg)
    out_cfg["target_modules"] = sorted(modules)
    out_cfg["target_parameters"] = sorted(params)
    fused = [p for p in params if p.endswith(".experts.gate_up_proj")]
    out_cfg["rank_pattern"] = {re.escape(p): 2 * r for p in sorted(fused)}
    out_cfg["alpha_pattern"] = {re.escape(p): 2 * alpha for p in sorted(fused)}
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "adapter_config.json").write_text(json.dumps(out_cfg, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    return dst
