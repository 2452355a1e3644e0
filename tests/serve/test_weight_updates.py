"""Weight pushes into a running server (sglang's /update_weights_from_disk, /load_lora_adapter,
/unload_lora_adapter): each is visible as a new weights version on /generate and changes what greedy decoding
writes; unloading gives back exactly the old outputs; a bad push is a 400 that changes nothing; all behind the key.

The engine here is the test's own (not the shared `tiny_engine`): its weights change.
"""

from __future__ import annotations

import httpx
import pytest
import torch
from rich.console import Console

from model.config import preset
from model.modeling import GLM5ForCausalLM
from model.tokenizer import save_tokenizer_files
from serve.http.app import create_app
from serve.http.server import load_engine
from serve.http.settings import ServerSettings
from tests.serve.server_thread import ServerThread

KEY = {"Authorization": "Bearer k"}
PROMPT = [5, 17, 99, 230, 11, 42]


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-seed1")
    GLM5ForCausalLM.from_config(preset("tiny"), seed=1).save_pretrained(path)
    save_tokenizer_files(path)
    return path


@pytest.fixture(scope="module")
def adapter(tiny_checkpoint, tmp_path_factory):
    """A LoRA adapter as `glm5 finetune sft` saves it, with B made non-zero (peft starts it at zero)."""
    from finetune.lora import LoraSettings, add_lora, save_adapter

    model = add_lora(GLM5ForCausalLM.from_pretrained(tiny_checkpoint), LoraSettings(rank=4, alpha=8))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    path = tmp_path_factory.mktemp("adapter")
    save_adapter(model, path, base=str(tiny_checkpoint))
    return path


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    engine, tok = load_engine(tiny_checkpoint, None, False, 4, 256, Console(quiet=True), kv_cache_gib=0.02)
    with ServerThread(create_app(engine, tok, ServerSettings("tiny", api_key="k"))) as s:
        s.wait_healthy()
        s.engine = engine
        yield s
    engine.shutdown()


def generate(server) -> tuple[list[int], str]:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}
    r = httpx.post(server.url + "/generate", json=body, headers=KEY, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"], r.json()["meta_info"]["weight_version"]


def post(server, path, body, headers=KEY):
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120)


def test_lora_push_changes_outputs_and_unload_restores_them(server, adapter, tiny_checkpoint):
    ids0, v0 = generate(server)
    assert (
        post(server, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapter)}, headers={}).status_code == 401
    )
    r = post(server, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapter)})
    assert r.status_code == 200 and r.json()["success"] and r.json()["loaded_adapters"] == {"a": str(adapter)}
    ids1, v1 = generate(server)
    assert int(v1) == int(v0) + 1 and r.json()["weight_version"] == v1
    assert ids1 != ids0
    assert httpx.get(server.url + "/get_weight_version", headers=KEY).json() == {"weight_version": v1}

    # The served weights are peft's own merge of the adapter.
    from finetune.lora import load_adapter, merge_lora

    merged = merge_lora(load_adapter(GLM5ForCausalLM.from_pretrained(tiny_checkpoint), adapter)).state_dict()
    served = server.engine.named_weights()
    for name in ("model.layers.0.self_attn.q_a_proj.weight", "model.layers.1.mlp.experts.0.up_proj.weight"):
        ref = merged[name]
        assert (served[name] - ref).abs().max() <= 1e-5 * ref.abs().max(), name

    # The same name again is refused, as sglang's LoRARegistry refuses it ("already exists"): a trainer pushes each
    # version under its own name. The newest is served; unloading an older one leaves the weights as they are.
    r = post(server, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapter)})
    assert r.status_code == 400 and "LoRA with name a already exists" in r.json()["error_message"], r.text
    r = post(server, "/load_lora_adapter", {"lora_name": "b", "lora_path": str(adapter), "weight_version": "step-2"})
    assert r.json()["success"] and r.json()["weight_version"] == "step-2" and generate(server) == (ids1, "step-2")
    assert r.json()["loaded_adapters"] == {"a": str(adapter), "b": str(adapter)}
    r = post(server, "/unload_lora_adapter", {"lora_name": "a"})
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {"b": str(adapter)}
    assert generate(server) == (ids1, "step-2")
    # unloading the served one puts the base back, bit for bit
    r = post(server, "/unload_lora_adapter", {"lora_name": "b"})
    assert r.status_code == 200 and r.json() == {
        "success": True,
        "error_message": "",
        "loaded_adapters": {},
        "weight_version": str(int(v1) + 2),
    }
    assert generate(server)[0] == ids0
    r = post(server, "/unload_lora_adapter", {"lora_name": "a"})
    assert r.status_code == 400 and not r.json()["success"]
    assert "LoRA with name a does not exist" in r.json()["error_message"]


def test_update_from_disk_swaps_the_checkpoint_with_a_named_version(server, other_checkpoint, tiny_checkpoint):
    ids0, _ = generate(server)
    r = post(server, "/update_weights_from_disk", {"model_path": str(other_checkpoint), "weight_version": "policy-7"})
    assert r.status_code == 200, r.text
    assert r.json()["success"] and r.json()["weight_version"] == "policy-7" and r.json()["num_paused_requests"] == 0
    ids1, v1 = generate(server)
    assert v1 == "policy-7" and ids1 != ids0
    r = post(server, "/update_weights_from_disk", {"model_path": str(tiny_checkpoint)})
    ids2, v2 = generate(server)
    assert r.json()["success"] and ids2 == ids0 and v2 not in ("policy-7", "0")


def test_a_bad_push_is_a_400_and_changes_nothing(server, tmp_path):
    ids0, v0 = generate(server)
    r = post(server, "/update_weights_from_disk", {"model_path": str(tmp_path / "nothing")})
    assert r.status_code == 400 and r.json()["success"] is False and "not a checkpoint directory" in r.json()["message"]
    bigger = tmp_path / "bigger"
    cfg = preset("tiny")
    GLM5ForCausalLM.from_config(
        type(cfg)(**{**cfg.__dict__, "hidden_size": cfg.hidden_size * 2}), seed=0
    ).save_pretrained(bigger)
    r = post(server, "/update_weights_from_disk", {"model_path": str(bigger)})
    assert r.status_code == 400 and "do not fit" in r.json()["message"], r.text
    # fewer layers: the old code applied the part that matched (its MTP layer over decoder layer 1) and said success
    fewer = tmp_path / "fewer"
    GLM5ForCausalLM.from_config(
        type(cfg)(**{**cfg.__dict__, "num_hidden_layers": cfg.num_hidden_layers - 1,
                     "mlp_layer_types": cfg.mlp_layer_types[:-1] if cfg.mlp_layer_types else None}), seed=0
    ).save_pretrained(fewer)  # fmt: skip
    r = post(server, "/update_weights_from_disk", {"model_path": str(fewer)})
    assert r.status_code == 400 and "2 decoder layers for 3" in r.json()["message"], r.text
    r = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    assert r.status_code == 400 and "not a peft LoRA adapter" in r.json()["error_message"]
    assert r.json()["loaded_adapters"] == {}
    assert generate(server) == (ids0, v0)


def _logits(model, ids=PROMPT) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return (out.logits if hasattr(out, "logits") else out)[0].float()


def test_an_adapter_on_int4_weights_is_served_beside_them_not_rounded_anew(tiny_checkpoint, adapter):
    """`glm5 serve BASE --quant int4 --lora A` serves W_int4 x + s*B(A x) on INT4 layers: the model the RL trainer
    of `glm5 finetune rl --quant int4` trains (the base rounded as INT4 rounds it, the adapter on top), to the
    kernels' precision. Merging first and quantizing the merge (what serve did before) rounds every adapted
    weight anew and lands far from it."""
    import copy

    from finetune.lora import AdapterBaseMismatch, load_adapter, merge_lora
    from model.int4_linear import Int4Linear
    from model.quant_int4 import quantize_int4, round_like_int4

    base = GLM5ForCausalLM.from_pretrained(tiny_checkpoint)
    engine, _ = load_engine(tiny_checkpoint, "int4", False, 4, 256, Console(quiet=True), kv_cache_gib=0.02,
                            lora=adapter)  # fmt: skip
    try:
        served = engine.core.model
        adapted = [m for m in served.modules() if isinstance(m, Int4Linear) and "low_rank" in m.__dict__]
        assert adapted, "no INT4 layer of tiny carries the adapter: the test would not test it"
        trained = copy.deepcopy(base)
        round_like_int4(trained)
        with pytest.warns(AdapterBaseMismatch):  # rounded: not the weights the adapter recorded
            exact = _logits(merge_lora(load_adapter(trained, adapter)))
        requantized = quantize_int4(merge_lora(load_adapter(copy.deepcopy(base), adapter)), strict=False)
        err_served = (_logits(served) - exact).abs().max().item()
        err_requantized = (_logits(requantized) - exact).abs().max().item()
        assert err_served < 0.2 * err_requantized, (err_served, err_requantized)
        assert err_served < 5e-3
    finally:
        engine.shutdown()


def test_a_lora_push_onto_an_int4_server_serves_it_beside_the_int4_weights(tiny_checkpoint, adapter):
    """/load_lora_adapter on a --quant int4 server (the rollout engine of `glm5 finetune rl --quant int4`): the
    INT4 layers take the factors, the others the merge; the result is what `--lora` at load serves, bit for bit;
    unloading gives back the bare INT4 outputs."""
    from model.int4_linear import Int4Linear

    engine, tok = load_engine(tiny_checkpoint, "int4", False, 4, 256, Console(quiet=True), kv_cache_gib=0.02)
    at_load, _ = load_engine(tiny_checkpoint, "int4", False, 4, 256, Console(quiet=True), kv_cache_gib=0.02,
                             lora=adapter)  # fmt: skip
    try:
        want = _logits(at_load.core.model)
        with ServerThread(create_app(engine, tok, ServerSettings("tiny", api_key="k"))) as s:
            s.wait_healthy()
            ids0, _ = generate(s)
            bare = _logits(engine.core.model)
            r = post(s, "/load_lora_adapter", {"lora_name": "rl", "lora_path": str(adapter), "weight_version": "1"})
            assert r.status_code == 200 and r.json()["success"], r.text
            assert any("low_rank" in m.__dict__ for m in engine.core.model.modules() if isinstance(m, Int4Linear))
            assert torch.equal(_logits(engine.core.model), want)
            assert generate(s)[1] == "1"
            r = post(s, "/unload_lora_adapter", {"lora_name": "rl"})
            assert r.status_code == 200 and r.json()["success"], r.text
            assert torch.equal(_logits(engine.core.model), bare) and generate(s)[0] == ids0
    finally:
        engine.shutdown()
        at_load.shutdown()


@pytest.mark.parametrize(
    "config, words",
    [
        ("{}", "r must be a positive integer"),
        ('{"r": 0, "lora_alpha": 8}', "r must be a positive integer"),
        ('{"r": 4, "lora_alpha": "abc"}', "lora_alpha must be a number"),
        ("not json", "not readable JSON"),
        ("[4]", "must hold a JSON object"),
        (None, "cannot read"),  # a good config beside a garbage adapter_model.safetensors
    ],
)
def test_a_malformed_adapter_is_a_400_naming_the_problem_and_changes_nothing(server, adapter, tmp_path, config, words):
    import shutil

    ids0, v0 = generate(server)
    bad = tmp_path / "bad-adapter"
    shutil.copytree(adapter, bad)
    if config is None:
        (bad / "adapter_model.safetensors").write_bytes(b"\x00garbage" * 10)
    else:
        (bad / "adapter_config.json").write_text(config)
    r = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": str(bad)})
    assert r.status_code == 400 and words in r.json()["error_message"], r.text
    assert r.json()["success"] is False and r.json()["loaded_adapters"] == {}
    assert generate(server) == (ids0, v0)


def test_a_garbage_checkpoint_file_is_a_400_and_changes_nothing(server, tiny_checkpoint, tmp_path):
    import shutil

    ids0, v0 = generate(server)
    bad = tmp_path / "garbage"
    shutil.copytree(tiny_checkpoint, bad)
    for f in bad.glob("*.safetensors"):
        f.write_bytes(b"\x00garbage" * 10)
    r = post(server, "/update_weights_from_disk", {"model_path": str(bad)})
    assert r.status_code == 400 and r.json()["success"] is False and "cannot read" in r.json()["message"], r.text
    assert generate(server) == (ids0, v0)
