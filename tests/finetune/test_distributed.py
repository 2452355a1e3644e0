"""torchrun + FSDP2: the ranks' rows of a batch, the sharded gradient against one process's (real `torchrun`
processes on gloo), and DCP checkpoints read back as the training loop's state (single process here; across
world sizes in tests/glm5cli/test_finetune_sft_distributed.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from finetune.dist_checkpoint import latest_dcp, load_resume, save_dcp
from finetune.distributed import Distributed
from finetune.lora import LoraSettings, add_lora
from finetune.sft import SFTConfig, train_sft
from finetune.train_loop import OptimConfig, training_state
from model import GLM5ForCausalLM
from model.config import preset
from tests.finetune.torchrun import torchrun

ROOT = Path(__file__).resolve().parents[2]


def test_torchrun_env_is_read_and_absent_outside_torchrun():
    assert Distributed.from_env({}) is None
    d = Distributed.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (d.rank, d.world_size, d.local_rank, d.is_main) == (3, 4, 1, False)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_ranks_rows_cover_the_batch_once_in_order(world):
    for n in range(0, 8):
        spans = [Distributed(r, world, r).rows(n) for r in range(world)]
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # contiguous, no overlap
        sizes = [b - a for a, b in spans]
        assert max(sizes) - min(sizes) <= 1


def _lora_model():
    return add_lora(GLM5ForCausalLM.from_config(preset("tiny"), seed=0), LoraSettings(rank=4), seed=0)


def test_a_dcp_checkpoint_reads_back_as_the_loops_state_and_the_newest_checkpoint_wins(tmp_path):
    torch.set_num_threads(1)
    model = _lora_model()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(0, 500, (12,), generator=g).tolist(), 4) for _ in range(3)]
    saved = []
    cfg = SFTConfig(OptimConfig(steps=3, lr=1e-3, warmup=1), batch_size=2)
    train_sft(model, seqs, cfg, save=lambda st: saved.append(save_dcp(tmp_path, st, named)), save_every=1)
    assert [p.name for p in saved] == ["dcp-1", "dcp-2"] and not (tmp_path / "dcp-1").exists()  # older removed
    folder, meta = latest_dcp(tmp_path)
    assert folder.name == "dcp-2" and meta["step"] == 2 and len(meta["losses"]) == 2

    fresh = _lora_model()
    fresh_named = [(n, p) for n, p in fresh.named_parameters() if p.requires_grad]
    state = load_resume(tmp_path, fresh_named)
    assert state["step"] == 2 and state["losses"] == meta["losses"]
    # The state resumes the run: one more step from it ends where the uninterrupted run ended, bit for bit.
    train_sft(fresh, seqs, cfg, resume=state)
    for (n, p), (_, q) in zip(named, fresh_named, strict=True):
        assert torch.equal(p, q), n

    # A single process's state.pt that is newer than the DCP checkpoint is the one resumed from.
    newer = training_state(3, named, torch.optim.AdamW([p for _, p in named]), losses=[[0.0, [], 0]] * 3)
    torch.save(newer, tmp_path / "state.pt")
    assert load_resume(tmp_path, fresh_named)["step"] == 3
    (tmp_path / "dcp-2" / "meta.json").unlink()  # a save killed midway: not a checkpoint
    assert latest_dcp(tmp_path) is None


def test_a_checkpoint_of_other_parameters_is_refused(tmp_path):
    model = _lora_model()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    save_dcp(tmp_path, training_state(1, named, torch.optim.AdamW([p for _, p in named]), losses=[]), named)
    other = add_lora(GLM5ForCausalLM.from_config(preset("tiny"), seed=0), LoraSettings(rank=8), seed=0)
    with pytest.raises(ValueError, match="does not fit|does not match"):
        load_resume(tmp_path, [(n, p) for n, p in other.named_parameters() if p.requires_grad])


def run_worker(tmp_path: Path, nproc: int = 2) -> dict:
    """tests/finetune/fsdp_worker.py under a real torchrun -> its results."""
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    torchrun(nproc, str(ROOT / "tests/finetune/fsdp_worker.py"), str(out), env=env)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_two_ranks_give_one_process_gradient_loss_and_clipping_norm(tmp_path):
    """The summed reduction over each rank's rows is the single-process gradient of the whole batch: LoRA and
    full, a batch split 2 + 1, one row (rank 1 runs an empty micro-batch), micro-batches of one row."""
    results = run_worker(tmp_path)
    assert set(results) == {"lora-3rows-micro0", "lora-1rows-micro0", "full-3rows-micro1"}
    for case, (err, norm, ref_norm, loss, ref_loss) in results.items():
        assert err < 1e-4, (case, err)  # an averaging reduction would be off by 0.5
        assert norm == pytest.approx(ref_norm, rel=1e-4), case
        assert loss == pytest.approx(ref_loss, rel=1e-5), case


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_mixed_precision_on_gpu_is_close_to_the_fp32_gradient(tmp_path):
    """On CUDA the shards compute in bf16 and reduce in fp32: the gradient is the fp32 one to bf16 precision."""
    results = run_worker(tmp_path, nproc=min(2, torch.cuda.device_count()))
    for case, (err, norm, ref_norm, loss, ref_loss) in results.items():
        assert err < 0.1, (case, err)
        assert norm == pytest.approx(ref_norm, rel=0.05), case
        assert loss == pytest.approx(ref_loss, rel=0.02), case
