"""`glm5 finetune sft --qlora`: LoRA over the FP8 base as stored, in one process and under a real 2-rank torchrun
(gloo) with the same loss curve; the adapter loads onto the base `glm5 serve` builds; bad combinations refused."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
from typer.testing import CliRunner

from glm5cli.app import app
from tests.finetune.quantized_ckpt import write_fp8, write_int4
from tests.glm5cli.test_finetune_sft import _sessions, ckpt  # noqa: F401  (a fixture)
from tests.glm5cli.test_finetune_sft_distributed import assert_curves_agree, finished, losses, torchrun
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})
OPTS = ["--steps", "6", "--lr", "3e-3", "--rank", "4", "--batch-size", "3", "--save-every", "0", "--qlora"]


def _with_side_files(src, out):
    for f in src.iterdir():
        if not f.name.endswith(".safetensors") and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def fp8(ckpt, tmp_path_factory):  # noqa: F811
    return _with_side_files(ckpt, write_fp8(ckpt, tmp_path_factory.mktemp("fp8")))


def test_qlora_on_the_fp8_base_in_one_process_and_two_ranks_gives_one_curve(fp8, tmp_path):
    from finetune.lora import AdapterBaseMismatch, load_adapter
    from model import GLM5ForCausalLM

    _sessions(tmp_path / "sessions")
    one = tmp_path / "one"
    r = runner.invoke(app, ["finetune", "sft", str(fp8), "--data", str(tmp_path / "sessions"), "--out", str(one),
                            *OPTS])  # fmt: skip
    assert r.exit_code == 0, r.output
    rec = json.loads((one / "adapter" / "adapter_base.json").read_text())
    assert rec["trained_over"] == "fp8" and rec["weights_fingerprint"] is None  # never whole here: not hashed
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdapterBaseMismatch)
        load_adapter(GLM5ForCausalLM.from_pretrained(fp8), one / "adapter")  # what `glm5 serve --lora` loads
    two = tmp_path / "two"
    finished(torchrun(["finetune", "sft", str(fp8), "--data", str(tmp_path / "sessions"), "--out", str(two), *OPTS]))
    assert_curves_agree(losses(two), losses(one))


def test_qlora_refuses_full_and_an_int4_merge(fp8, ckpt, tmp_path):  # noqa: F811
    _sessions(tmp_path / "sessions")
    data = ["--data", str(tmp_path / "sessions"), "--out", str(tmp_path / "o")]
    r = runner.invoke(app, ["finetune", "sft", str(fp8), *data, "--qlora", "--full"])
    assert r.exit_code == 2 and "--qlora" in r.output
    int4 = _with_side_files(ckpt, write_int4(ckpt, tmp_path / "int4"))
    r = runner.invoke(app, ["finetune", "sft", str(int4), *data, "--qlora", "--merge"])
    assert r.exit_code == 2 and "--quant int4 --lora" in r.output
    assert not (tmp_path / "o").exists()
