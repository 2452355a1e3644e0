"""LoRA through peft on GLM-5: inject adapters, save and load them in peft's format, merge them back.

    model = add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(rank=16))   # the rest frozen
    save_adapter(model, out)           # adapter_config.json + adapter_model.safetensors (peft's own files)
    load_adapter(plain_model, out)     # peft's inject_adapter_in_model + set_peft_model_state_dict
    merge_lora(model)                  # a plain model again, the deltas folded in

LoRA goes on the main layers only: the MTP layer drafts for whatever the main model becomes, and
`glm5 finetune align-mtp` re-aligns it afterwards.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from finetune.qlora import FROZEN_TYPES  # a frozen FP8 / INT4 / bf16 base (finetune/sharded_load.py)

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
    import peft  # imports transformers (~5 s): only where adapters are made, saved or read

    n_main = model.config.num_hidden_layers
    layers = "|".join(str(i) for i in range(n_main))
    names = "|".join(re.escape(t) for t in settings.targets)
    cfg = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=rf"model\.layers\.({layers})\..*\b({names})",
    )
    cfg._register_custom_module({t: peft.tuners.lora.layer.Linear for t in FROZEN_TYPES})
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = peft.inject_adapter_in_model(cfg, model)
    if not any("lora_" in n for n, _ in model.named_parameters()):
        raise ValueError(f"no module matches the LoRA targets {settings.targets}")
    return model


BASE_FILE = "adapter_base.json"  # our record of the base beside peft's files (peft's config has no place for it)


class AdapterBaseMismatch(UserWarning):
    """An adapter loaded onto weights other than the ones it was trained on."""


@torch.no_grad()
def weights_fingerprint(model) -> str:
    """A hash of the base weights (LoRA factors excluded): every tensor's name, shape and dtype, and a strided
    sample of up to 4096 of its values, so that two checkpoints of one architecture with different weights
    differ, without reading all of a large model. sha256, hex."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda x: x[0]):
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")  # the same tensor, before or after LoRA wraps its module
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)][:4096].to(torch.float32).contiguous()
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()


def save_adapter(
    model,
    path: Path,
    base: str | None = None,
    fingerprint: str | None = None,
    state: dict | None = None,
    quant: str | None = None,
) -> None:
    """peft's adapter files (adapter_config.json with `base_model_name_or_path`, adapter_model.safetensors) and
    adapter_base.json: the base checkpoint and its `weights_fingerprint`, which `load_adapter` checks, and `quant`
    when the adapter was trained on the base's INT4 weights (`glm5 finetune rl --quant int4`: serve it with
    `--quant int4`). `state`: the model's parameters by name, whole (a sharded model's, gathered:
    finetune/distributed.py)."""
    import peft  # imports transformers (~5 s): only where adapters are made, saved or read

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.peft_config["default"]
    if base is not None:
        cfg.base_model_name_or_path = str(base)
    cfg.save_pretrained(str(path))
    state = {k: v.detach().contiguous() for k, v in peft.get_peft_model_state_dict(model, state).items()}
    save_file(state, str(path / "adapter_model.safetensors"))
    fp = fingerprint or weights_fingerprint(model)
    record = {"base_model_name_or_path": base, "weights_fingerprint": fp, **({"quant": quant} if quant else {})}
    (path / BASE_FILE).write_text(json.dumps(record, indent=1))


def trained_quant(path: Path) -> str | None:
    """The quantization the adapter at `path` was trained on (adapter_base.json's `quant`), or None."""
    f = Path(path) / BASE_FILE
    try:
        return json.loads(f.read_text()).get("quant") if f.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None


def check_base(model, path: Path) -> str | None:
    """Warn (AdapterBaseMismatch) if `model`'s weights are not the ones the adapter at `path` was trained on.
    -> the warning's text, or None when they match or the adapter recorded no fingerprint."""
    f = Path(path) / BASE_FILE
    if not f.is_file():
        return None
    rec = json.loads(f.read_text())
    if rec.get("weights_fingerprint") in (None, weights_fingerprint(model)):
        return None
    msg = (
        f"the adapter {path} was trained on other weights ({rec.get('base_model_name_or_path') or 'unknown base'}, "
        f"fingerprint {str(rec['weights_fingerprint'])[:12]}); its deltas may not fit this model"
    )
    warnings.warn(msg, AdapterBaseMismatch, stacklevel=3)
    return msg


def load_adapter(model, path: Path):
    """Load an adapter that `save_adapter` (or peft) wrote into a plain model. -> the model, with LoRA.
    Warns (AdapterBaseMismatch) when the model is not the base the adapter recorded."""
    import peft  # imports transformers (~5 s): only where adapters are made, saved or read

    path = Path(path)
    if not (path / "adapter_config.json").is_file():
        raise ValueError(f"{path} has no adapter_config.json: not a peft adapter")
    try:  # an adapter folder is outside data: what does not parse as one is a clear error, not a traceback
        cfg = json.loads((path / "adapter_config.json").read_text(encoding="utf-8", errors="replace"))
        if not isinstance(cfg, dict) or cfg.get("peft_type") not in ("LORA", None):
            raise ValueError("adapter_config.json is not a LoRA adapter's config")
        check_base(model, path)
        config = peft.LoraConfig.from_pretrained(str(path))
        tensors = load_file(str(path / "adapter_model.safetensors"))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OSError, SafetensorError) as e:
        raise ValueError(f"{path} is not an adapter glm5 can load: {type(e).__name__}: {str(e)[:200]}") from None
    model = peft.inject_adapter_in_model(config, model)
    result = peft.set_peft_model_state_dict(model, tensors)
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
    from peft.tuners.lora import LoraLayer  # imports transformers (~5 s): only where adapters are read

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name), attr, module.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model
