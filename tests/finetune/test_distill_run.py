"""finetune/distill_run.py: teachers and prompts by domain, refused when they do not pair up, and a step log that
a resumed run cuts back to its checkpoint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from finetune.distill import Prompt
from finetune.distill_run import StepLog, check_domains, parse_teachers, read_prompts, split_domain


class FakeTokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_teachers_by_domain(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "ad").mkdir()
    (tmp_path / "ad" / "adapter_config.json").write_text("{}")
    got = parse_teachers([f"math={tmp_path / 'ckpt'}", "base", f"agent={tmp_path / 'ad'}"])
    assert got == {"math": tmp_path / "ckpt", "default": None, "agent": tmp_path / "ad"}
    with pytest.raises(ValueError, match="two teachers for domain 'math'"):
        parse_teachers(["math=base", f"math={tmp_path / 'ckpt'}"])
    with pytest.raises(ValueError, match="not a checkpoint"):
        parse_teachers([str(tmp_path)])
    with pytest.raises(ValueError, match="expected DOMAIN=VALUE"):
        split_domain("=base")


def test_prompts_take_their_file_domain_unless_a_line_names_one(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({"prompt": "ab"}) + "\n" + json.dumps({"prompt": "c", "domain": "sql"}) + "\n")
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"prompt": "d", "reward": {"type": "regex", "pattern": "x"}}) + "\n")
    got = read_prompts([("code", a), ("default", b)], FakeTokenizer())
    assert got == [Prompt([97, 98], "code"), Prompt([99], "sql"), Prompt([100], "default")]
    check_domains(got, {"code": None, "sql": None, "default": None})
    with pytest.raises(ValueError, match=r"no teacher for the prompts of domain\(s\) \['sql'\]"):
        check_domains(got, {"code": None, "default": None})
    with pytest.raises(ValueError, match=r"no prompts for the teacher\(s\) of domain\(s\) \['math'\]"):
        check_domains(got, {"code": None, "sql": None, "default": None, "math": None})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "domain": 3}) + "\n")
    with pytest.raises(ValueError, match=f"{bad}:1"):
        read_prompts([("default", bad)], FakeTokenizer())
    with pytest.raises(ValueError, match="cannot read"):
        read_prompts([("default", tmp_path / "missing.jsonl")], FakeTokenizer())


def _info(step: int, kl: float):
    return SimpleNamespace(step=step, loss=SimpleNamespace(lm=kl, tokens=10), lr=1e-3, seconds=0.5)


def test_step_log_is_cut_back_to_the_checkpoint_on_resume(tmp_path):
    path = tmp_path / "train_log.jsonl"
    log = StepLog(path)
    for s in range(1, 6):
        log.write(_info(s, 1.0 / s))
    StepLog(path, resume_step=2).write(_info(3, 9.0))  # killed after step 5, checkpoint at step 2
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["reverse_kl"] == 9.0
    StepLog(path)  # a fresh run starts an empty log
    assert path.read_text() == ""
