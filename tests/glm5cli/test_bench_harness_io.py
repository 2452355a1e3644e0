"""`glm5 bench swe --predictions` writes the SWE-bench harness's format; `glm5 bench compare RUN REPORT` reads the
harness's run report beside a glm5 run."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.sandbox import probe
from glm5cli.app import app
from tests.agent.bench.conftest import calc_repo, calc_row, calc_tasks, sh  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")
runner = CliRunner()


def bench(*args):
    return runner.invoke(app, ["bench", *map(str, args)], catch_exceptions=False)


def test_predictions_out_and_a_harness_report_in(tmp_path, calc_tasks, calc_repo):  # noqa: F811 (fixtures)
    out, preds = tmp_path / "run", tmp_path / "preds.jsonl"
    r = bench("swe", calc_tasks, "--out", out, "--agent", "oracle", "--predictions", preds)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in preds.read_text().splitlines()]
    assert [x["instance_id"] for x in rows] == ["acme__calc-1", "acme__calc-2"]
    assert all(set(x) == {"instance_id", "model_name_or_path", "model_patch"} for x in rows)
    assert rows[0]["model_name_or_path"] == "oracle" and "+    return a + b" in rows[0]["model_patch"]

    report = tmp_path / "oracle.check.json"
    report.write_text(json.dumps({"resolved_ids": ["acme__calc-1"], "unresolved_ids": ["acme__calc-2"],
                                  "error_ids": ["other-1"], "completed_ids": ["acme__calc-1", "acme__calc-2"]}))  # fmt: skip
    r = bench("compare", out, report, "--json")
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)
    assert c["compared"] == 2 and c["agree"] == 1
    assert [d["instance_id"] for d in c["disagree"]] == ["acme__calc-2"] and c["only_harness"] == ["other-1"]
    r = bench("compare", out, report)
    assert "1 of 2 instances graded alike" in r.stdout and "differ: acme__calc-2" in r.stdout

    report.write_text(json.dumps({"summary": "not a harness report"}))
    r = bench("compare", out, report)
    assert r.exit_code != 0 and "not a SWE-bench harness run report" in r.output

    utils = pytest.importorskip("swebench.harness.utils")  # the harness reads them with its own reader
    assert [p["instance_id"] for p in utils.get_predictions_from_file(str(preds), "x", "test")] == [
        "acme__calc-1", "acme__calc-2"]  # fmt: skip
