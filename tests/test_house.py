"""Issue 45's house rules hold for the product code: no import circle, no file over 500 lines, no function body
over 80 lines (scripts/house_check.py measures them; `python scripts/house_check.py` prints what breaks them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _house_check():
    spec = importlib.util.spec_from_file_location("house_check", ROOT / "scripts" / "house_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_house_rules_hold():
    assert _house_check().breaches(ROOT) == []


def test_the_check_sees_a_circle_a_long_file_and_a_long_function(tmp_path):
    """The check itself can fail: a product tree with one of each breach is reported three times."""
    pkg = tmp_path / "agent"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from agent import b\n")
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (pkg / "b.py").write_text("def f():\n" + body + "\n\n\nfrom agent.a import *  # noqa\n" + "#\n" * 420)
    found = _house_check().breaches(tmp_path)
    assert any(x.startswith("circle agent.a <-> agent.b") for x in found), found
    assert any(x.startswith("file agent/b.py: 50") for x in found), found
    assert any(x.startswith("function agent/b.py:1 f: body of 81 lines") for x in found), found
