"""Our LoRA adapter, exported by lora_hf, loaded by peft itself into transformers' GlmMoeDsaForCausalLM: our logits.

The base checkpoint is ours (save_pretrained), which transformers reads with its fused experts. The config sets
rms_norm_eps=1e-6 (transformers' q_a/kv_a norms use 1e-6, see tests/model/test_parity_transformers.py) and no MTP
layer (transformers has none; add_lora leaves it alone anyway).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from finetune.lora import LoraSettings, add_lora, save_adapter
from finetune.lora_hf import export_hf_adapter
from model import GLM5ForCausalLM
from model.config import preset
from tests.model.conftest import close

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _trained_adapter(tmp_path, targets=None):
    """A tiny checkpoint and a LoRA on it with every factor random (B nonzero), saved by save_adapter."""
    cfg = preset("tiny").replace(rms_norm_eps=1e-6, num_nextn_predict_layers=0)
    GLM5ForCausalLM.from_config(cfg, seed=0).save_pretrained(tmp_path / "ckpt")
    net = GLM5ForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    settings = LoraSettings(rank=3, alpha=5) if targets is None else LoraSettings(rank=3, alpha=5, targets=targets)
    net = add_lora(net, settings)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in net.named_parameters():
            if "lora_" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    save_adapter(net, tmp_path / "adapter")
    return net.eval(), torch.randint(0, cfg.vocab_size, (2, 21), generator=g)


@pytest.mark.parametrize("targets", [None, ("o_proj", "up_proj", "down_proj")], ids=["all", "some"])
def test_peft_loads_our_adapter_into_transformers_with_our_logits(tmp_path, targets):
    ours, ids = _trained_adapter(tmp_path, targets)
    with torch.no_grad():
        want = ours(ids)
    export_hf_adapter(tmp_path / "adapter", tmp_path / "adapter_hf")
    cfg = json.loads((tmp_path / "adapter_hf" / "adapter_config.json").read_text())
    assert "model.layers.1.mlp.experts.down_proj" in cfg["target_parameters"]

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    assert type(hf).__name__ == "GlmMoeDsaForCausalLM"
    with torch.no_grad():
        base = hf(ids).logits
    assert not close(base, want, 1e-2)  # the adapter moves the logits: the comparison below can fail
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(missing|unexpected).*")
        pm = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter_hf")).eval()
    # Every tensor of the file is in the model, and the model has no LoRA tensor that the file lacks.
    from safetensors.torch import load_file

    file = load_file(str(tmp_path / "adapter_hf" / "adapter_model.safetensors"))
    loaded = peft.get_peft_model_state_dict(pm)
    assert loaded.keys() == file.keys()
    assert all(torch.equal(loaded[k], file[k]) for k in file)
    with torch.no_grad():
        got = pm(ids).logits
    # The same sums in another order (peft folds B@A into the weight, ours runs x@A then @B): fp32 rounding.
    assert close(got, want, 5e-5), (got - want).abs().max()


def test_export_refuses_what_is_not_our_adapter(tmp_path):
    with pytest.raises(ValueError, match="no adapter_config.json"):
        export_hf_adapter(tmp_path, tmp_path / "out")
