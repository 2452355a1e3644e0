"""write_checkpoint: a stage's checkpoint is its weights plus the model's files of the checkpoint it started from,
never that run's outputs (an RL checkpoint's adapter and logs must not reappear in the SFT trained from it)."""

from __future__ import annotations

import json

import torch

from finetune.artifacts import write_checkpoint
from model import GLM5ForCausalLM
from model.checkpoint import load_pretrained
from model.config import preset


def _model(seed: int) -> GLM5ForCausalLM:
    torch.manual_seed(seed)
    net = GLM5ForCausalLM(preset("tiny"))
    with torch.no_grad():
        for t in [*net.parameters(), *net.buffers()]:
            if t.is_floating_point():
                t.normal_(0, 0.02)
    return net


def test_a_checkpoint_keeps_the_models_files_and_drops_the_earlier_runs_outputs(tmp_path):
    src, dest = tmp_path / "rl", tmp_path / "forget"
    _model(0).save_pretrained(src)
    for name in ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "dsa_warmup.json"):
        (src / name).write_text("{}")
    # what the RL run that wrote `src` left beside its merged weights
    for folder in ("adapter", "adapter_hf", "adapters/step-3"):
        (src / folder).mkdir(parents=True)
        (src / folder / "adapter_model.safetensors").write_bytes(b"x")
    for name in ("rl_log.jsonl", "train_log.jsonl", "engine.log", "distill_run.json", "run.json", "state.pt"):
        (src / name).write_text("earlier run")
    dest.mkdir()
    (dest / "train_log.jsonl").write_text("this run\n")  # the new run's own outputs stay as they are
    net = _model(1)
    write_checkpoint(src, net, dest)

    kept = {p.name for p in dest.iterdir()}
    assert {"config.json", "model.safetensors", "chat_template.jinja", "tokenizer.json", "tokenizer_config.json",
            "dsa_warmup.json", "train_log.jsonl"} <= kept  # fmt: skip
    assert kept.isdisjoint({"adapter", "adapter_hf", "adapters", "rl_log.jsonl", "engine.log", "distill_run.json",
                            "run.json", "state.pt"})  # fmt: skip
    assert (dest / "train_log.jsonl").read_text() == "this run\n"
    assert json.loads((dest / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    back = load_pretrained(GLM5ForCausalLM, dest)
    for (n, a), (_, b) in zip(net.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), n  # the weights are net's, not the source's


def test_a_link_out_of_the_checkpoint_is_not_copied_into_the_new_one(tmp_path, caplog):
    """A downloaded folder whose tokenizer.json links to a secret elsewhere must not leak that secret into every
    checkpoint trained from it; a Hugging Face cache snapshot, whose files link into the entry's blobs/, still
    copies (as regular files)."""
    secret = tmp_path / "home" / ".ssh" / "id_rsa"
    secret.parent.mkdir(parents=True)
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    entry = tmp_path / "hub" / "models--zai-org--tiny"
    snap = entry / "snapshots" / "abc123"
    _model(0).save_pretrained(snap)
    (entry / "blobs").mkdir()
    (entry / "blobs" / "f00d").write_text('{"template": true}')
    (snap / "chat_template.jinja").symlink_to("../../blobs/f00d")
    (snap / "tokenizer.json").symlink_to(secret)
    (snap / "dangling.json").symlink_to(tmp_path / "nowhere")

    dest = tmp_path / "sft"
    with caplog.at_level("WARNING"):
        write_checkpoint(snap, _model(1), dest)

    assert not (dest / "tokenizer.json").exists()
    assert "BEGIN OPENSSH" not in "".join(p.read_text(errors="ignore") for p in dest.iterdir() if p.is_file())
    assert "tokenizer.json" in caplog.text and "outside the checkpoint" in caplog.text
    kept = dest / "chat_template.jinja"
    assert not kept.is_symlink() and kept.read_text() == '{"template": true}'
    assert not (dest / "dangling.json").exists()


def test_a_folder_from_before_a_setting_existed_resumes_when_it_keeps_that_settings_old_value(tmp_path):
    """RunDir(added=...): run.json written before `config.negative_weight` existed resumes while the new setting
    keeps the behaviour it had then (1.0), and is refused, naming what differs, when it does not."""
    import pytest

    from finetune.run_dir import RunDir, RunError

    out = tmp_path / "rl"
    old = {"model": "m", "config": {"steps": 8, "lr": 2e-4}}
    (tmp_path / ".rl.partial").mkdir()
    (tmp_path / ".rl.partial" / "run.json").write_text(json.dumps(old))
    from agent.provenance import mark  # as this machine marked it (a folder it did not start is not resumed)

    (tmp_path / ".rl.partial" / "provenance.mark").write_text(mark(json.dumps(old).encode() + b"\0"))
    added = {"config.negative_weight": 1.0}
    assert RunDir(out, {"model": "m", "config": {"steps": 8, "lr": 2e-4, "negative_weight": 1.0}}, added).resuming
    with pytest.raises(RunError, match=r"config.negative_weight: 1.0 then, 0.0 now"):
        RunDir(out, {"model": "m", "config": {"steps": 8, "lr": 2e-4, "negative_weight": 0.0}}, added)
    with pytest.raises(RunError, match=r"config.negative_weight: '\(absent\)' then, 1.0 now"):
        RunDir(out, {"model": "m", "config": {"steps": 8, "lr": 2e-4, "negative_weight": 1.0}})
    with pytest.raises(RunError, match=r"config.lr: 0.0002 then, 0.001 now"):
        RunDir(out, {"model": "m", "config": {"steps": 8, "lr": 1e-3, "negative_weight": 1.0}}, added)
