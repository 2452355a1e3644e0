"""Reports escape what tasks and trials supply, and a run folder's hostile lines are skipped (issue 40, item 7)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from agent.bench.reports import build_report, junit_xml, markdown
from agent.bench.run_folder import read_results

EVIL_ID = "x`<!-- hide the rest -->`|[click](http://evil.example)\n## fake"
EVIL_WHY = "failing: <img src=http://evil.example/p.png> <!-- \x00\x1b[31m | **bold**\n# heading"


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    config = {"kind": "swe", "agent": {"agent": "cmd", "model": "<b>m</b>"}, "k": 1, "task_ids": [EVIL_ID, "ok-1"],
              "shard": "1/1"}  # fmt: skip
    (run / "config.json").write_text(json.dumps(config))
    rows = [{"instance_id": EVIL_ID, "attempt": 0, "status": "unresolved", "resolved": False, "reward": 0.0,
             "reason": EVIL_WHY, "failing_tests": ["t::<a>\x07"], "test_config_changed": ["conftest.py"]},
            {"instance_id": "ok-1", "attempt": 0, "status": "resolved", "resolved": True, "reward": 1.0}]  # fmt: skip
    lines = [json.dumps(r) for r in rows]
    lines += ["[" * 100000 + "]" * 100000, "1" * 50000, '{"instance_id": 3}', '{"status": "x", "attempt": "a"}', "{"]
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_summary_md_shows_task_text_as_text(tmp_path):
    md = markdown(build_report([_run(tmp_path)]))
    assert "<!--" not in md and "<img" not in md and "<b>" not in md
    assert "](http" not in md  # no live link
    assert "\n## fake" not in md and "\n# heading" not in md  # one line per row
    row = next(line for line in md.splitlines() if "hide the rest" in line)
    assert row.count(" | ") == 2  # the table keeps its three columns


def test_junit_is_valid_xml_whatever_a_task_says(tmp_path):
    xml = junit_xml(build_report([_run(tmp_path)]))
    root = ET.fromstring(xml.split("\n", 1)[1])  # a parser reads it back: no NUL, no escape codes
    names = [c.get("name") for c in root.iter("testcase")]
    assert "ok-1" in names and any("hide the rest" in n for n in names)
    assert "\x00" not in xml and "\x1b" not in xml


def test_hostile_result_lines_are_skipped_not_a_crash(tmp_path):
    rows = read_results(_run(tmp_path) / "results.jsonl")
    assert [r["instance_id"] for r in rows] == [EVIL_ID, "ok-1"]
