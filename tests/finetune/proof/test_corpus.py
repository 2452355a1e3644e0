"""The base's copy drills: what is asked back is quoted verbatim, code lines and pairs among it (some inside a block
of code with look-alike lines), train names only."""

from __future__ import annotations

import json
import re
from pathlib import Path

from finetune.proof.corpus import write_drills
from plugins.bench_suites.repair_family import name_pool


def test_drills_ask_for_paths_names_and_lines_of_code_back_verbatim(tmp_path):
    path = write_drills(tmp_path / "drill.jsonl", 2000, seed=3, in_code=0.15)
    drills = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    assert len(drills) == 2000
    answers, in_code = [], 0
    for ask, answer in drills:
        assert ask["role"] == "user" and answer["role"] == "assistant"
        parts = answer["content"].split("\n")
        text, blocks = ask["content"], re.findall(r"```python\n(.*?)\n```", ask["content"], re.S)
        if blocks:  # a pair among code: x once, y not there, and a look-alike of x beside it
            in_code += 1
            (block,) = blocks
            code = [row.strip() for row in block.split("\n")]
            x, y = parts
            assert code.count(x) == 1 and y not in code
            assert any(row != x and row.split()[:2] == x.split()[:2] for row in code)
            text = text.replace(f"```python\n{block}\n```", "")
        assert re.findall(r"`([^`]*)`", text) == parts  # each part quoted, in the order it is written
        answers.append(parts)
    pairs = [a for a in answers if len(a) == 2]
    lines = [x for a in answers for x in a if x.startswith(("return ", "if ", "def ")) or " = " in x]
    assert 220 < in_code < 380  # ~15%
    assert 550 < len(pairs) < 850  # ~35%: in code, and bare ~1 in 5
    assert sum(1 for a, b in pairs if a != b and a.split()[0] == b.split()[0]) > 50  # near copies: order matters
    assert len(lines) > 900 and len(set(lines)) > 600  # lines of code, drawn afresh, not a few memorised ones
    assert any(x.endswith(".py") for a in answers for x in a)
    words = {w for a in answers for x in a for w in re.findall(r"[a-z_]+", x)}
    assert not words & (set(name_pool("heldout")) - set(name_pool("train")))  # held-out names never appear
    assert path.read_text() == write_drills(tmp_path / "again.jsonl", 2000, seed=3, in_code=0.15).read_text()  # seeded


def test_fresh_names_are_new_to_every_split_and_off_by_default_the_drills_are_unchanged(tmp_path):
    from finetune.proof.corpus import FRESH_NOUNS, FRESH_VERBS

    family = set(name_pool("train")) | set(name_pool("heldout"))
    plain = write_drills(tmp_path / "plain.jsonl", 1500, seed=4).read_text()
    assert plain == write_drills(tmp_path / "zero.jsonl", 1500, seed=4, fresh_names=0.0).read_text()
    path = write_drills(tmp_path / "fresh.jsonl", 1500, seed=4, fresh_names=0.5)
    names = []
    for line in path.read_text().splitlines():
        for part in json.loads(line)["messages"][1]["content"].split("\n"):
            names += re.findall(r"(?:def |::test_|^)([a-z]+_[a-z]+)(?:\(|$)", part)
    fresh = [n for n in names if n not in family]
    assert names and 0.3 < len(fresh) / len(names) < 0.7  # about half
    words = [n for n in fresh if n.split("_")[0] in FRESH_VERBS and n.split("_")[1] in FRESH_NOUNS]
    assert 0.3 < len(words) / len(fresh) < 0.7  # half of unused words, half nonsense (never the family's words)
    assert not {w for n in fresh for w in n.split("_")} & {w for n in family for w in n.split("_")}
    assert not set(names) & (set(name_pool("heldout")) - set(name_pool("train")))  # still no held-out name


def test_made_up_drills_quote_names_of_no_split_and_off_by_default_the_drills_are_unchanged(tmp_path):
    family = set(name_pool("train")) | set(name_pool("heldout"))
    plain = write_drills(tmp_path / "plain.jsonl", 1500, seed=5).read_text()
    assert plain == write_drills(tmp_path / "zero.jsonl", 1500, seed=5, nonsense=0.0).read_text()
    path = write_drills(tmp_path / "made.jsonl", 1500, seed=5, nonsense=0.5)
    drills = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    names, paths = [], []
    for ask, answer in drills:
        parts = answer["content"].split("\n")
        assert re.findall(r"`([^`]*)`", ask["content"]) == parts  # still a verbatim copy
        for part in parts:
            names += re.findall(r"(?:def |::test_|^)([a-z]+_[a-z]+)(?:\(|$)", part)
            paths += re.findall(r"^([a-z]+)/[a-z]+\.py$", part)
    made = [n for n in names if n not in family]
    assert names and 0.2 < len(made) / len(names) < 0.6  # the made-up drills' names
    words = {w for n in family for w in n.split("_")}
    assert all(not set(n.split("_")) <= words for n in made)  # at least one made-up word in each
    assert any(n.split("_")[0] in words for n in made) and any(n.split("_")[1] in words for n in made)
    assert any(p not in {"corelib", "mathkit"} and p not in plain for p in paths)  # made-up paths too
    assert not set(names) & (set(name_pool("heldout")) - set(name_pool("train")))  # no held-out name


def test_number_drills_quote_a_comparison_with_its_constant_and_off_by_default_the_drills_are_unchanged(tmp_path):
    plain = write_drills(tmp_path / "plain.jsonl", 1500, seed=6, nonsense=0.5).read_text()
    assert plain == write_drills(tmp_path / "zero.jsonl", 1500, seed=6, nonsense=0.5, numbers=0.0).read_text()
    with_numbers = write_drills(tmp_path / "num.jsonl", 1500, seed=6, nonsense=0.5, numbers=0.2).read_text()
    line = re.compile(r"if \w+ (<|<=|>|>=) (\d+):")

    def comparisons(text: str) -> tuple[int, list[tuple[str, list[str]]]]:
        """(drills, the drills answered by comparison lines only: one, or two with one constant)"""
        drills = [json.loads(row)["messages"] for row in text.splitlines()]
        found = []
        for ask, answer in drills:
            rows = answer["content"].split("\n")
            m = [line.fullmatch(r) for r in rows]
            if all(m) and (len(m) == 1 or m[0].group(2) == m[1].group(2)):
                found.append((ask["content"], rows))
        return len(drills), found

    n, before = comparisons(plain)
    n, after = comparisons(with_numbers)
    assert 0.15 < (len(after) - len(before)) / n < 0.25  # a fifth more of them
    pairs = [rows for _, rows in after if len(rows) == 2]
    assert 0.45 < len(pairs) / len(after) < 0.75  # 3 in 5 of the number drills are pairs
    for ask, rows in after:
        assert all(f"`{r}`" in ask for r in rows)  # every answered line is quoted in the prompt, verbatim
    assert all(line.fullmatch(a).group(1) != line.fullmatch(b).group(1) for a, b in pairs)  # another operator


def test_the_dev_echo_tests_prompts_stay_fixed_and_quote_their_answers():
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_proof_echo.py"
    spec = importlib.util.spec_from_file_location("bench_proof_echo", path)
    echo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(echo)
    cases = echo.prompts()
    assert all(len(items) == echo.N for items in cases.values())
    for items in cases.values():
        for ask, answer in items:
            assert all(f"`{line}`" in ask for line in answer.split("\n"))
    # checkpoints scored at different times are compared kind by kind (benchmarks/proof_echo.json): a kind added
    # later must not change the draws of the kinds before it
    assert cases["train"][0] == ("Echo `pad_items`.", "pad_items")
    assert cases["number"][0] == ("Echo `if m <= 17:`.", "if m <= 17:")
    assert cases["path"][0] == ("Echo `sumwise/traffic.py`.", "sumwise/traffic.py")
    old, new = cases["off_by_one-pair"][0][1].split("\n")
    assert old in (f"{new} + 1", f"{new} - 1")
    assert {tuple(a.split("\n")) for _, a in cases["wrong_return-pair"]} <= {("return hi", "return lo"),
                                                                            ("return lo", "return hi")}  # fmt: skip
