"""LoRA through peft on GLM-5: inject adapters, save and load them in peft's format, merge them back.

    model = add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(rank=16))   # the rest frozen
    save_adapter(model, out)           # adapter_config.json + adapter_model.safetensors (peft's own files)
    load_adapter(plain_model, out)     # peft's inject_adapter_in_model + set_peft_model_state_dict
    merge_lora(model)                  # a plain model again, the deltas folded in

LoRA goes on the main layers only: the MTP layer drafts for whatever the main model becomes, and
`glm5 finetune align-mtp` re-aligns it afterwards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Every linear of GLM-5's attention and MLPs (experts and shared expert included); not the router, the
# indexer or the lm_head (GLM-5's high-precision set, model/quant_int4.py).
DEFAULT_TARGETS = (
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_b_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    targets: tuple[str, ...] = field(default=DEFAULT_TARGETS)


def add_lora(model, settings: LoraSettings = LoraSettings(), seed: int = 0):
    """Inject peft LoRA adapters into the main layers' target linears; freeze everything else. -> model.
    The adapters' random initialisation comes from `seed` (not the global RNG): a run is reproducible, and an
    interrupted one can be checked against an uninterrupted one."""
    import peft

    n_main = model.config.num_hidden_layers
    layers = "|".join(str(i) for i in range(n_main))
    names = "|".join(re.escape(t) for t in settings.targets)
    cfg = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=rf"model\.layers\.({layers})\..*\b({names})",
    )
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = peft.inject_adapter_in_model(cfg, model)
    if not any("lora_" in n for n, _ in model.named_parameters()):
        raise ValueError(f"no module matches the LoRA targets {settings.targets}")
    return model


def save_adapter(model, path: Path) -> None:
    """peft's adapter files: adapter_config.json and adapter_model.safetensors."""
    import peft
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.peft_config["default"].save_pretrained(str(path))
    state = {k: v.detach().contiguous() for k, v in peft.get_peft_model_state_dict(model).items()}
    save_file(state, str(path / "adapter_model.safetensors"))


def load_adapter(model, path: Path):
    """Load an adapter that `save_adapter` (or peft) wrote into a plain model. -> the model, with LoRA."""
    import peft
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "adapter_config.json").is_file():
        raise ValueError(f"{path} has no adapter_config.json: not a peft adapter")
    model = peft.inject_adapter_in_model(peft.LoraConfig.from_pretrained(str(path)), model)
    result = peft.set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{path} does not fit this model: missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}"
        )
    return model


@torch.no_grad()
def merge_lora(model):
    """Fold every LoRA delta into its base linear and put the base linear back: a plain model again (the MoE's
    stacked expert weights, which the expert linears view, take the merged values too). -> model."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name), attr, module.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model
