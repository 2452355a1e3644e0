"""finetune/sharded_load.py + finetune/qlora.py: LoRA over a frozen FP8 / INT4 base that no rank holds whole.
One process matches the dequantised model; two gloo ranks give one process's losses holding half its weights
each; a rank whose address space is limited below the full-precision model's size still trains."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from finetune.lora import LoraSettings, add_lora
from finetune.sft import sft_loss
from finetune.sharded_load import load_lora_sharded
from model import GLM5ForCausalLM
from model.checkpoint import CheckpointError
from model.config import preset
from tests.finetune.quantized_ckpt import write_dense, write_fp8, write_int4, write_random_fp8
from tests.finetune.torchrun import torchrun

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("qlora")
    dense = write_dense(d / "dense")
    return {"dense": dense, "fp8": write_fp8(dense, d / "fp8"), "int4": write_int4(dense, d / "int4")}


def _nonzero_b(model) -> None:
    """B starts at 0 (the adapter a no-op, no gradient into A): give it values so that every factor is tested."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(n)))


def _batch():
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones(2, 24, dtype=torch.bool)


def test_fp8_base_frozen_as_stored_gives_the_dequantised_models_loss_and_adapter_gradients(ckpts):
    model, named = load_lora_sharded(ckpts["fp8"], LoraSettings(rank=4), seed=1)
    frozen = {p.dtype for n, p in model.named_parameters() if n.endswith("weight_fp8")}
    assert frozen == {torch.float8_e4m3fn}  # the base stays FP8 in memory
    assert all("lora_" in n for n, _ in named)  # only the adapter trains
    ref = add_lora(GLM5ForCausalLM.from_pretrained(ckpts["fp8"], dtype=torch.float32), LoraSettings(rank=4), seed=1)
    _nonzero_b(model), _nonzero_b(ref)
    out, want = sft_loss(model, *_batch()), sft_loss(ref, *_batch())
    out.loss.backward(), want.loss.backward()
    assert out.lm == pytest.approx(want.lm, rel=1e-6)
    got = dict(named)
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
    assert got.keys() == ref_grads.keys()  # the same adapters, by name, as add_lora on the plain model
    for n, g in ref_grads.items():
        assert (got[n].grad is None) == (g is None), n  # an expert no token reached: no gradient in either
        if g is not None:
            assert torch.allclose(got[n].grad, g, rtol=1e-4, atol=1e-7), n
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


def test_int4_base_starts_at_the_int4_models_own_loss(ckpts):
    model, _ = load_lora_sharded(ckpts["int4"], LoraSettings(rank=4), seed=1)
    assert any(n.endswith("weight_packed") and p.dtype == torch.int32 for n, p in model.named_parameters())
    served = GLM5ForCausalLM.from_pretrained(ckpts["int4"], dtype=torch.float32)  # Int4Linear, as `glm5 serve`
    with torch.no_grad():
        assert sft_loss(model, *_batch()).lm == pytest.approx(sft_loss(served, *_batch()).lm, rel=1e-3)


def test_a_tensor_of_the_wrong_shape_or_a_missing_one_is_named(ckpts, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ckpts["fp8"].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    shard = sorted(bad.glob("*.safetensors"))[0]
    state = load_file(shard)
    victim = next(n for n in state if n.endswith("o_proj.weight"))
    state[victim] = state[victim][:-1]
    save_file(state, shard, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"shape mismatch: {victim}"):
        load_lora_sharded(bad, LoraSettings(rank=4))


def run_worker(ckpt: Path, out: Path, *extra: str) -> dict:
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2", MALLOC_MMAP_THRESHOLD_="131072"
    )  # fmt: skip  (large blocks back to the OS when freed: see below)
    torchrun(2, str(ROOT / "tests/finetune/qlora_worker.py"), str(ckpt), str(out), *extra, env=env)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("base", ["fp8", "int4"])
def test_two_gloo_ranks_give_one_process_losses_holding_half_the_weights_each(ckpts, base, tmp_path):
    from finetune.plan import Layout, plan
    from model.config import GLM5Config

    result = run_worker(ckpts[base], tmp_path / "r.json", "--reference", "--steps", "3")
    ref = result["reference"]
    # `glm5 finetune plan`'s arithmetic for this layout (CPU: the unquantised tensors fp32; INT4 groups of 32)
    rows = plan(GLM5Config.from_pretrained(ckpts[base]), Layout(gpus=2, base=base, lora_rank=4, dense_bytes=4,
                                                                int4_group=32)).rows  # fmt: skip
    for rank in result["ranks"]:
        assert rank["losses"] == pytest.approx(ref["losses"], rel=1e-5)  # the same curve, 3 steps of AdamW
        assert 0.45 < rank["base_bytes"] / ref["base_bytes"] < 0.55
        assert rank["adapter_bytes"] == ref["adapter_bytes"] // 2 == rows["adapter"]
        assert rank["base_bytes"] == pytest.approx(rows["weights"], rel=0.05)  # INT4: its scales are fp32 here


@pytest.mark.slow
def test_two_gloo_ranks_with_adamw_offloaded_to_host_memory_give_one_process_losses(ckpts, tmp_path):
    """--offload-optimizer under FSDP2: each rank keeps AdamW's state for its own shards (a DTensor's local
    tensor) in host memory; the losses are the in-memory AdamW's of one process."""
    result = run_worker(ckpts["int4"], tmp_path / "r.json", "--reference", "--steps", "3", "--offload")
    for rank in result["ranks"]:
        assert rank["losses"] == pytest.approx(result["reference"]["losses"], rel=1e-5)


@pytest.mark.slow
def test_a_rank_limited_below_the_full_models_size_still_trains(tmp_path):
    """268M parameters: 1 GiB in fp32, what every rank loaded before; the FP8 checkpoint is 260 MB. Each rank may
    map 600 MiB beyond what it had after importing torch and peft and joining the group (RLIMIT_AS); glibc is told
    to return large freed blocks (MALLOC_MMAP_THRESHOLD_), as its default dynamic threshold keeps them mapped."""
    cfg = preset("small").replace(vocab_size=1024, hidden_size=512, moe_intermediate_size=512, n_routed_experts=64,
                                  num_hidden_layers=6, num_nextn_predict_layers=0, pad_token_id=0, eos_token_id=(1,))  # fmt: skip
    ckpt = write_random_fp8(tmp_path / "fp8", cfg)
    result = run_worker(ckpt, tmp_path / "r.json", "--budget-mb", "600", "--steps", "2")
    for rank in result["ranks"]:
        assert len(rank["losses"]) == 2 and all(x == x for x in rank["losses"])
        assert rank["dense_load"].startswith("failed")  # the whole model in fp32 does not fit the same limit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_fp8_base_computes_in_bf16_close_to_the_cpu_fp32_loss(ckpts):
    """The GPU layout: the frozen FP8 base stays FP8 on the device, the rest bf16, the adapter fp32."""
    cuda, _ = load_lora_sharded(ckpts["fp8"], LoraSettings(rank=4), seed=1, device="cuda")
    cpu, _ = load_lora_sharded(ckpts["fp8"], LoraSettings(rank=4), seed=1)
    assert {p.dtype for n, p in cuda.named_parameters() if "lora_" in n} == {torch.float32}
    assert cuda.model.embed_tokens.weight.dtype == torch.bfloat16
    ids, mask = _batch()
    got = sft_loss(cuda, ids.cuda(), mask.cuda())
    got.loss.backward()
    assert got.lm == pytest.approx(sft_loss(cpu, ids, mask).lm, rel=2e-2)
    assert torch.cuda.max_memory_allocated() < 64 * 2**20  # a tiny model: nothing whole beyond it
