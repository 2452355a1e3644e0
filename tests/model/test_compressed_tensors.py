"""The compressed-tensors pack-quantized format: bit layout from the spec, config block, reading and writing.

A checkpoint "written by another tool" is built here straight from the format's specification (hand-rolled
packing with Python ints, a different scale rule, arbitrary zero points), not with our writer.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from model.compressed_tensors import (
    CompressedTensorsError,
    Int4Scheme,
    QuantizationConfig,
    pack_int4,
    read_quantization_config,
    read_tensors,
    unpack_int4,
)
from model.int4_linear import Int4Linear
from model.int4_load import apply_compressed_tensors
from model.int4_write import quantize_checkpoint
from model.quant_int4 import quantize_int4
from tests.model.conftest import close
from tests.model.test_quant_int4 import TinyLM


def _i32(u: int) -> int:
    return u - (1 << 32) if u >= 1 << 31 else u


def test_pack_layout_from_the_spec():
    # q = -8..7 is stored as u = q + 8 = 0..15; element k sits at bits 4*(k % 8) of word k // 8.
    q = torch.arange(-8, 8, dtype=torch.int8).view(1, 16)
    packed = pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (1, 2)
    assert packed.tolist() == [[0x76543210, _i32(0xFEDCBA98)]]
    assert torch.equal(unpack_int4(packed, 16), q)
    # Along the output dim (zero points): the 8 rows of a column share one word.
    assert pack_int4(q.view(16, 1), dim=0).tolist() == [[0x76543210], [_i32(0xFEDCBA98)]]
    # A ragged tail is padded with q = -8 (u = 0) bits and dropped on unpack.
    q3 = torch.tensor([[7, -8, 1]], dtype=torch.int8)
    assert pack_int4(q3).tolist() == [[0x90F]]  # u = 15, 0, 9
    assert torch.equal(unpack_int4(pack_int4(q3), 3), q3)


def test_pack_matches_the_compressed_tensors_library():
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    torch.manual_seed(0)
    for shape in [(24, 64), (13, 70), (8, 8)]:
        q = torch.randint(-8, 8, shape, dtype=torch.int8)
        assert torch.equal(pack_int4(q), helpers.pack_to_int32(q, 4))
        assert torch.equal(pack_int4(q, dim=0), helpers.pack_to_int32(q, 4, packed_dim=0))
        assert torch.equal(unpack_int4(helpers.pack_to_int32(q, 4), shape[1]), q)


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match="int4 range"):
        pack_int4(torch.tensor([[8]], dtype=torch.int8))
    with pytest.raises(ValueError, match="2-D int8"):
        pack_int4(torch.zeros(4, dtype=torch.int8))
    with pytest.raises(ValueError, match="cannot hold"):
        unpack_int4(torch.zeros(2, 1, dtype=torch.int32), 9)


W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
            "input_activations": None,
            "output_activations": None,
        }
    },
    "ignore": ["lm_head", "re:.*indexer\\.weights_proj$", "re:.*eh_proj$"],
}


def test_config_block_round_trip_and_matching():
    cfg = QuantizationConfig.from_json(W4A16)
    assert cfg.groups["group_0"] == Int4Scheme(32, True, ("Linear",))
    assert cfg.scheme_for("model.layers.0.mlp.experts.1.up_proj") == Int4Scheme(32, True, ("Linear",))
    assert cfg.scheme_for("lm_head") is None
    assert cfg.scheme_for("model.layers.3.self_attn.indexer.weights_proj") is None
    assert cfg.scheme_for("model.layers.3.self_attn.indexer.wk") is not None
    assert cfg.scheme_for("x", class_names=("Embedding",)) is None  # targets match classes, not every module
    block = cfg.to_json()
    assert block["quant_method"] == "compressed-tensors" and block["format"] == "pack-quantized"
    w = block["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["symmetric"], w["strategy"], w["group_size"]) == (4, "int", True, "group", 32)
    assert QuantizationConfig.from_json(block) == cfg


def test_our_config_block_validates_with_the_compressed_tensors_library():
    qc = pytest.importorskip("compressed_tensors.quantization")
    block = QuantizationConfig({"group_0": Int4Scheme(128, False)}, ignore=("lm_head",)).to_json()
    parsed = qc.QuantizationConfig.model_validate({k: v for k, v in block.items() if k != "version"})
    w = parsed.config_groups["group_0"].weights
    assert (w.num_bits, w.type, w.symmetric, w.strategy, w.group_size) == (4, "int", False, "group", 128)
    assert parsed.format == "pack-quantized" and parsed.ignore == ["lm_head"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b.update(quant_method="fp8"), "quant_method"),
        (lambda b: b.update(format="float-quantized"), "format 'float-quantized'"),
        (lambda b: b["config_groups"]["group_0"]["weights"].update(num_bits=8), "8-bit"),
        (lambda b: b["config_groups"]["group_0"]["weights"].update(strategy="channel"), "strategy 'channel'"),
        (lambda b: b["config_groups"]["group_0"].update(input_activations={"num_bits": 8}), "W4A16"),
        (lambda b: b["config_groups"]["group_0"]["weights"].update(actorder="group"), "actorder"),
        (lambda b: b.update(config_groups={}), "no config_groups"),
    ],
)
def test_unsupported_configs_are_named(change, message):
    block = json.loads(json.dumps(W4A16))
    change(block)
    with pytest.raises(CompressedTensorsError, match=message):
        QuantizationConfig.from_json(block)


# ---------------------------------------------------------------------------------------------------------------
# A checkpoint from "another tool", built from the spec alone.


def _spec_pack_rows(u_rows: list[list[int]]) -> torch.Tensor:
    """Pack unsigned nibbles 8 per int32, element k at bits 4*(k % 8) of word k // 8 (Python ints)."""
    out = []
    for row in u_rows:
        words = []
        for start in range(0, len(row), 8):
            word = 0
            for j, u in enumerate(row[start : start + 8]):
                word |= u << (4 * j)
            words.append(_i32(word))
        out.append(words)
    return torch.tensor(out, dtype=torch.int32)


def _spec_quantize(w: torch.Tensor, gs: int, symmetric: bool, gen: torch.Generator):
    """Another tool's choices: symmetric scale max/7 (not ours), asymmetric with random zero points."""
    n, k = w.shape
    wg = w.view(n, k // gs, gs)
    if symmetric:
        scale = wg.abs().amax(-1) / 7
        zp = torch.zeros(n, k // gs)
    else:
        zp = torch.randint(-3, 4, (n, k // gs), generator=gen).float()
        scale = (wg.amax(-1) - wg.amin(-1)) / 15
    q = (wg / scale[..., None] + zp[..., None]).round().clamp(-8, 7)
    deq = ((q - zp[..., None]) * scale[..., None]).view(n, k)
    return q.view(n, k).long(), scale, zp.long(), deq


def _write_foreign_checkpoint(path, model: nn.Module, symmetric: bool, gs: int = 32) -> dict[str, torch.Tensor]:
    """Write `model` as a W4A16 checkpoint following only the spec. Returns the dense weights it stands for."""
    gen = torch.Generator().manual_seed(7)
    tensors, dense = {}, {}
    ignore = ["lm_head", "re:.*indexer\\.weights_proj$", "re:.*eh_proj$"]
    for name, t in model.state_dict().items():
        module = name.rpartition(".")[0]
        m = model.get_submodule(module)
        quantized = isinstance(m, nn.Linear) and module != "lm_head" and "weights_proj" not in module
        quantized = quantized and "eh_proj" not in module
        if quantized and name.endswith(".weight"):
            q, scale, zp, deq = _spec_quantize(t, gs, symmetric, gen)
            tensors[f"{module}.weight_packed"] = _spec_pack_rows((q + 8).tolist())
            tensors[f"{module}.weight_scale"] = scale.to(torch.bfloat16)
            tensors[f"{module}.weight_shape"] = torch.tensor(list(t.shape))
            if not symmetric:
                # zero points [N, G] packed along the output dim: transpose, pack rows, transpose back
                tensors[f"{module}.weight_zero_point"] = _spec_pack_rows((zp + 8).t().tolist()).t().contiguous()
            dense[name] = (
                (q - zp.repeat_interleave(gs, 1)) * scale.to(torch.bfloat16).float().repeat_interleave(gs, 1)
            ).float()
            assert torch.allclose(dense[name], deq, atol=1e-2 * deq.abs().max().item())
        else:
            tensors[name] = t.clone()
            dense[name] = t
    save_file(tensors, str(path / "model.safetensors"))
    block = json.loads(json.dumps(W4A16))
    block["config_groups"]["group_0"]["weights"].update(symmetric=symmetric, group_size=gs)
    block["ignore"] = ignore
    (path / "config.json").write_text(json.dumps({"architectures": ["TinyLM"], "quantization_config": block}))
    return dense


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("impl", ["fast", "plain"])
def test_a_checkpoint_written_from_the_spec_loads(tmp_path, symmetric, impl):
    torch.manual_seed(8)
    src = TinyLM()
    dense = _write_foreign_checkpoint(tmp_path, src, symmetric)
    reference = TinyLM()
    reference.load_state_dict(dense)

    qcfg = read_quantization_config(tmp_path)
    model = TinyLM()
    rest = apply_compressed_tensors(model, read_tensors(tmp_path), qcfg, impl=impl)
    model.load_state_dict(rest, strict=True)
    assert isinstance(model.model.layers[1].mlp.experts[2].gate_proj, Int4Linear)
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, Int4Linear)
    # The loaded module multiplies by exactly the weights the spec says the checkpoint holds.
    got = model.model.layers[0].self_attn.q_a_proj.dequantize()
    want = dense["model.layers.0.self_attn.q_a_proj.weight"]
    assert torch.allclose(got, want, atol=1e-2 * want.abs().max().item())
    ids = torch.randint(0, 48, (2, 9))
    with torch.no_grad():
        y, y_ref = model(ids), reference(ids)
    assert (y - y_ref).abs().max() < 0.03 * y_ref.abs().max()


def test_loader_names_a_checkpoint_that_does_not_fit_the_model(tmp_path):
    _write_foreign_checkpoint(tmp_path, TinyLM(), True)
    state, qcfg = read_tensors(tmp_path), read_quantization_config(tmp_path)
    with pytest.raises(CompressedTensorsError, match="model expects"):
        apply_compressed_tensors(TinyLM(d=128), state, qcfg)
    state["model.layers.0.nothere.weight_packed"] = state["model.layers.0.self_attn.q_a_proj.weight_packed"]
    with pytest.raises(CompressedTensorsError, match="no such module"):
        apply_compressed_tensors(TinyLM(), state, qcfg)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["quant_method"] = "awq"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CompressedTensorsError, match="'awq' is not supported"):
        read_quantization_config(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# Our writer.


def _write_dense_checkpoint(path, model: nn.Module) -> None:
    path.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"architectures": ["TinyLM"], "dtype": "float32"}))
    (path / "tokenizer.json").write_text("{}")


@pytest.mark.parametrize("symmetric", [True, False])
def test_writer_output_is_pack_quantized_and_loads_back(tmp_path, symmetric):
    torch.manual_seed(9)
    src_model = TinyLM()
    _write_dense_checkpoint(tmp_path / "src", src_model)
    summary = quantize_checkpoint(tmp_path / "src", tmp_path / "out", group_size=32, symmetric=symmetric)
    out = tmp_path / "out"
    assert (out / "tokenizer.json").exists() and (out / "model.safetensors.index.json").exists()
    assert summary["quantized_modules"] == 2 * (1 + 1 + 5 * 3)

    block = json.loads((out / "config.json").read_text())["quantization_config"]
    assert block["quant_method"] == "compressed-tensors" and block["format"] == "pack-quantized"
    assert block["config_groups"]["group_0"]["targets"] == ["Linear"]
    w = block["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"], w["symmetric"]) == (
        4,
        "int",
        "group",
        32,
        symmetric,
    )
    # Linears left in high precision are listed; the router (2-D weight, FP8-split BF16) too; embeddings are not.
    assert "lm_head" in block["ignore"] and "model.layers.1.eh_proj" in block["ignore"]
    assert "model.layers.0.self_attn.indexer.weights_proj" in block["ignore"]
    assert "model.layers.0.self_attn.indexer.wk" in block["ignore"]
    assert "model.layers.0.mlp.gate" in block["ignore"] and "model.embed_tokens" not in block["ignore"]

    state = read_tensors(out)
    name = "model.layers.1.mlp.experts.0.down_proj"
    assert state[f"{name}.weight_packed"].dtype == torch.int32 and state[f"{name}.weight_packed"].shape == (64, 4)
    assert state[f"{name}.weight_scale"].shape == (64, 1) and state[f"{name}.weight_scale"].dtype == torch.float32
    assert state[f"{name}.weight_shape"].tolist() == [64, 32]
    assert (f"{name}.weight_zero_point" in state) == (not symmetric)
    if not symmetric:
        assert state[f"{name}.weight_zero_point"].shape == (8, 1)
    assert f"{name}.weight" not in state and "lm_head.weight" in state and "model.embed_tokens.weight" in state

    # The writer's checkpoint gives the same network as quantize_int4 on the dense model.
    loaded = TinyLM()
    loaded.load_state_dict(apply_compressed_tensors(loaded, state, read_quantization_config(out)))
    swapped = TinyLM()
    swapped.load_state_dict(src_model.state_dict())
    quantize_int4(swapped, group_size=32, symmetric=symmetric)
    ids = torch.randint(0, 48, (1, 6))
    with torch.no_grad():
        assert close(loaded(ids), swapped(ids), 1e-5)


def test_writer_output_decompresses_with_the_compressed_tensors_library(tmp_path):
    pq = pytest.importorskip("compressed_tensors.compressors.pack_quantized")
    qc = pytest.importorskip("compressed_tensors.quantization")
    torch.manual_seed(10)
    src_model = TinyLM()
    _write_dense_checkpoint(tmp_path / "src", src_model)
    quantize_checkpoint(tmp_path / "src", tmp_path / "out", group_size=32, symmetric=False)
    block = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    scheme = qc.QuantizationScheme.model_validate(block["config_groups"]["group_0"])
    state = read_tensors(tmp_path / "out")
    name = "model.layers.0.mlp.experts.1.up_proj"
    local = {k.rpartition(".")[2]: v for k, v in state.items() if k.rpartition(".")[0] == name}
    theirs = pq.PackedQuantizationCompressor.decompress(local, scheme)["weight"]
    model = TinyLM()
    model.load_state_dict(apply_compressed_tensors(model, state, read_quantization_config(tmp_path / "out"), "plain"))
    mine = model.get_submodule(name).dequantize()
    assert close(theirs.float(), mine, 1e-6)
    original = src_model.get_submodule(name).weight
    assert (mine - original).abs().max() < 0.2 * original.abs().max()


def test_writer_refuses_bad_requests(tmp_path):
    _write_dense_checkpoint(tmp_path / "src", TinyLM())
    with pytest.raises(ValueError, match="group_size must be one of"):
        quantize_checkpoint(tmp_path / "src", tmp_path / "out", group_size=100)
    with pytest.raises(ValueError, match="different directory"):
        quantize_checkpoint(tmp_path / "src", tmp_path / "src")
    quantize_checkpoint(tmp_path / "src", tmp_path / "q", group_size=32)
    with pytest.raises(ValueError, match="already quantized"):
        quantize_checkpoint(tmp_path / "q", tmp_path / "qq", group_size=32)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        quantize_checkpoint(tmp_path / "empty", tmp_path / "x")


# ---------------------------------------------------------------------------------------------------------------
# The GLM-5 model: `glm5 model quantize` output loads through GLM5ForCausalLM.from_pretrained.


def test_glm5_quantized_checkpoint_round_trip(tmp_path):
    from model.config import preset
    from model.kv_cache import KVCache
    from model.modeling import GLM5ForCausalLM

    torch.manual_seed(11)
    cfg = preset("tiny")
    dense = GLM5ForCausalLM.from_config(cfg, seed=3).eval()
    dense.save_pretrained(tmp_path / "dense")
    quantize_checkpoint(tmp_path / "dense", tmp_path / "int4", group_size=32)

    loaded = GLM5ForCausalLM.from_pretrained(tmp_path / "int4")
    swapped = GLM5ForCausalLM.from_config(cfg, seed=3).eval()
    quantize_int4(swapped, group_size=32, strict=False)  # tiny's q_lora_rank 48 is not a multiple of 32
    names = {n for n, m in loaded.named_modules() if isinstance(m, Int4Linear)}
    assert names == {n for n, m in swapped.named_modules() if isinstance(m, Int4Linear)}
    assert "model.layers.1.mlp.experts.5.down_proj" in names and "model.layers.0.self_attn.kv_b_proj" in names
    assert "lm_head" not in names and not any("weights_proj" in n or "q_b_proj" in n for n in names)
    assert not any(n.endswith("indexer.wk") for n in names) and "model.layers.0.self_attn.indexer.wq_b" not in names
    assert loaded.model.layers[1].mlp.gate.weight.dtype == torch.float32

    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        y_loaded, y_swapped, y_dense = loaded(ids), swapped(ids), dense(ids)
        assert close(y_loaded, y_swapped, 1e-4)
        assert (y_loaded - y_dense).abs().max() < 0.25 * y_dense.abs().max()
        # Incremental decoding (the absorbed MLA path reads kv_b_proj's dense_weight) agrees with the full pass.
        cache = KVCache.for_config(cfg)
        prefix = loaded(ids[:, :8], cache=cache)
        steps = [loaded(ids[:, t : t + 1], cache=cache) for t in range(8, 12)]
    full = torch.cat([prefix] + steps, dim=1)
    assert (full - y_loaded).abs().max() < 0.05 * y_loaded.abs().max()


def test_an_fp8_source_checkpoint_is_dequantized_before_int4(tmp_path):
    from model.fp8 import dequantize_fp8, quantize_fp8

    torch.manual_seed(14)
    src_model = TinyLM()
    (tmp_path / "fp8").mkdir()
    tensors, dense = {}, {}
    for name, t in src_model.state_dict().items():
        fp8 = name.endswith(".weight") and t.ndim == 2 and "embed" not in name and "lm_head" not in name
        if fp8 and "mlp.gate." not in name:  # as GLM-5-FP8: linears in FP8 with a block scale each
            q, scale = quantize_fp8(t)
            tensors[name], tensors[name + "_scale_inv"] = q, scale
            dense[name] = dequantize_fp8(q, scale)
        else:
            tensors[name] = dense[name] = t.clone()
    save_file(tensors, str(tmp_path / "fp8" / "model.safetensors"))
    (tmp_path / "fp8" / "config.json").write_text(json.dumps({"architectures": ["TinyLM"]}))
    quantize_checkpoint(tmp_path / "fp8", tmp_path / "int4", group_size=32)

    state = read_tensors(tmp_path / "int4")
    assert not any(k.endswith("_scale_inv") for k in state)
    assert state["model.layers.0.self_attn.indexer.wk.weight"].dtype == torch.bfloat16  # kept, as bf16
    reference = TinyLM()
    reference.load_state_dict(dense)
    model = TinyLM()
    model.load_state_dict(apply_compressed_tensors(model, state, read_quantization_config(tmp_path / "int4")))
    ids = torch.randint(0, 48, (1, 8))
    with torch.no_grad():
        y, y_ref = model(ids), reference(ids)
    assert (y - y_ref).abs().max() < 0.1 * y_ref.abs().max()
