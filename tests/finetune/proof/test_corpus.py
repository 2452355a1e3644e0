"""The base's copy drills: what is asked back is quoted verbatim, code lines and pairs among it, train names only."""

from __future__ import annotations

import json
import re

from finetune.proof.corpus import write_drills
from plugins.bench_suites.repair_family import name_pool


def test_drills_ask_for_paths_names_and_lines_of_code_back_verbatim(tmp_path):
    path = write_drills(tmp_path / "drill.jsonl", 2000, seed=3)
    drills = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    assert len(drills) == 2000
    answers = []
    for ask, answer in drills:
        assert ask["role"] == "user" and answer["role"] == "assistant"
        parts = answer["content"].split("\n")
        assert re.findall(r"`([^`]*)`", ask["content"]) == parts  # each part quoted, in the order it is written
        answers.append(parts)
    pairs = [a for a in answers if len(a) == 2]
    lines = [x for a in answers for x in a if x.startswith(("return ", "if ", "def ")) or " = " in x]
    assert 250 < len(pairs) < 550  # ~1 in 5
    assert sum(1 for a, b in pairs if a != b and a.split()[0] == b.split()[0]) > 50  # near copies: order matters
    assert len(lines) > 900 and len(set(lines)) > 600  # lines of code, drawn afresh, not a few memorised ones
    assert any(x.endswith(".py") for a in answers for x in a)
    words = {w for a in answers for x in a for w in re.findall(r"[a-z_]+", x)}
    assert not words & (set(name_pool("heldout")) - set(name_pool("train")))  # held-out names never appear
    assert path.read_text() == write_drills(tmp_path / "again.jsonl", 2000, seed=3).read_text()  # seeded
