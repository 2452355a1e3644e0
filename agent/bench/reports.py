"""Reports derived from run folders: report.json, JUnit XML, markdown; shards merged; two runs compared.

A report over several folders (the shards of one suite) is the report one job would have written: the folders
must agree on kind, agent, k, the suite and the settings that change results; their task lists are unioned.
JUnit: one <testcase> per task (classname glm5.bench.<kind>), a <failure> naming the failing tests when not
every graded attempt resolved, an <error> when infra errors left no attempt graded, <skipped> when not run.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from agent.bench.run_folder import RESULT_KEYS, RunFolder, RunFolderError, final_results
from agent.bench.scores import paired_difference, per_task, summarize
from agent.bench.trial import write_json

SCHEMA = "glm5-bench-report/1"
ATTEMPT_KEYS = ("attempt", "status", "resolved", "reward", "reason", "failing_tests", "flaky_tests",
                "test_config_changed", "exit_status",
                "prompt_tokens", "completion_tokens", "cost_usd", "seconds", "try", "trial_dir")  # fmt: skip


def load_runs(folders: list[Path]) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """(the shared config, every task id, the final result of every trial) of folders that make one run."""
    configs, results, ids = [], [], []
    for f in folders:
        folder = RunFolder(f)
        c = folder.config()
        if c is None:
            raise RunFolderError(f"{f}: no config.json; not a glm5 bench run folder")
        configs.append(c)
        ids += [i for i in c.get("task_ids", []) if i not in ids]
        results += list(final_results(folder.lines()).values())
    first = configs[0]
    if first.get("suite_ids"):
        ids = list(first["suite_ids"])  # a missing shard's tasks show as not run
    for f, c in zip(folders[1:], configs[1:], strict=True):
        keys = [k for k in RESULT_KEYS if k != "tasks_digest"] + ["suite_digest"]
        diff = [k for k in keys if c.get(k) != first.get(k)]
        if diff:
            raise RunFolderError(f"{f} is not part of the same run as {folders[0]} (differs in {', '.join(diff)})")
    seen: dict[tuple[str, int], dict] = {}
    for r in results:
        seen[(r["instance_id"], int(r["attempt"]))] = r  # a trial two shards both ran counts once
    return first, ids, [seen[k] for k in sorted(seen)]


def build_report(folders: list[Path]) -> dict[str, Any]:
    config, ids, results = load_runs([Path(f) for f in folders])
    k = int(config.get("k", 1))
    tasks = per_task(results)
    shards = sorted({RunFolder(f).config().get("shard", "1/1") for f in folders})
    n_shards = int(shards[0].split("/")[1]) if shards else 1
    per: dict[str, Any] = {}
    for i in ids:
        t = tasks.get(i, {"n": 0, "c": 0, "infra": 0, "attempts": []})
        if not t["attempts"]:
            status = "not_run"
        elif t["n"] == 0:
            status = "infra_error"
        else:
            status = "resolved" if t["c"] == t["n"] else "unresolved"
        per[i] = {"status": status, "resolved": t["c"], "graded": t["n"], "infra_errors": t["infra"],
                  "attempts": [{k_: a.get(k_) for k_ in ATTEMPT_KEYS} for a in t["attempts"]]}  # fmt: skip
    summary = summarize(results, k, n_tasks=len(ids))
    summary["not_run"] = sum(1 for p in per.values() if p["status"] == "not_run")
    # tries that hit an infra error and were retried (the retry's result is the one scored)
    lines = [r for f in folders for r in RunFolder(f).lines()]
    summary["infra_errors_retried"] = sum(1 for r in lines if r["status"] == "infra_error") - summary["infra_errors"]
    return {
        "schema": SCHEMA,
        "kind": config.get("kind"),
        "agent": config.get("agent"),
        "k": k,
        "env": config.get("env"),
        "source": config.get("source"),
        "shards": shards,
        "complete": len(shards) == n_shards and summary["not_run"] == 0,
        "runs": [str(f) for f in folders],
        "summary": summary,
        "tasks": per,
    }


def junit_xml(report: dict[str, Any]) -> str:
    """The report as JUnit XML, written with junitparser: one test case per task (unresolved: a failure naming the
    failing tests; infra error: an error; not run: skipped); the counts and times are junitparser's sums of them."""
    s = report["summary"]
    kind = report.get("kind") or "bench"
    suite = TestSuite(_x(f"glm5 bench {kind}"))
    for key in dict.fromkeys(("resolved_rate", "pass@1", f"pass@{report['k']}", "infra_errors", "cost_usd")):
        suite.add_property(key, _x(s.get(key)))  # first: the JUnit schema wants the properties before the cases
    for tid, t in report["tasks"].items():
        secs = sum(float(a.get("seconds") or 0) for a in t["attempts"])
        case = TestCase(_x(tid), _x(f"glm5.bench.{kind}"), round(secs, 3))
        result = _junit_result(t)
        if result is not None:
            case.result = [result]
        case.system_out = _x("\n".join(
            f"attempt {a['attempt']}: {a['status']} reward={a.get('reward')} {a.get('trial_dir') or ''}"
            for a in t["attempts"]
        ))  # fmt: skip
        suite.add_testcase(case)
    xml = JUnitXml("glm5 bench")
    xml.add_testsuite(suite)
    xml.update_statistics()
    out = io.BytesIO()
    xml.write(out, pretty=True)
    return out.getvalue().decode("utf-8")


def _junit_result(t: dict[str, Any]) -> Failure | Error | Skipped | None:
    """A task's JUnit result: None when resolved."""
    graded = [a for a in t["attempts"] if a["status"] != "infra_error"]
    if t["status"] == "unresolved":
        failing = sorted({x for a in graded if not a["resolved"] for x in (a.get("failing_tests") or [])})
        reasons = sorted({a.get("reason") or "" for a in graded if not a["resolved"]} - {""})
        msg = f"unresolved ({t['resolved']}/{t['graded']} attempts resolved)"
        if failing:
            msg += "; failing: " + ", ".join(failing[:20])
        result: Failure | Error | Skipped = Failure(_x(msg), "unresolved")
        result.text = _x("\n".join(reasons))
    elif t["status"] == "infra_error":
        why = t["attempts"][-1].get("reason") or ""
        result = Error(_x(f"infrastructure error: {why}"), "infra_error")
        result.text = _x("\n".join(a.get("reason") or "" for a in t["attempts"]))
    elif t["status"] == "not_run":
        result = Skipped("not run (another shard, or the run was interrupted)")
    else:
        return None
    return result


_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~>-])")


def _x(value: Any) -> str:
    """Text a task or a trial supplied, fit for XML 1.0: characters XML cannot hold (NUL, escape codes) become
    U+FFFD, so one task cannot make junit.xml unreadable to CI (ElementTree escapes <, & and quotes itself)."""
    return _XML_BAD.sub("\ufffd", str(value))


def _md(value: Any, limit: int = 160) -> str:
    """Text a task or a trial supplied, inert in GitHub markdown: one line, markdown's punctuation escaped, and
    < & as entities (an HTML comment would hide the rest of summary.md; a link or an image would reach out)."""
    text = " ".join(str(value).split())[:limit]
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _code(value: Any) -> str:
    """A task id: a code span when it holds only what ids are made of, else escaped text (_md), so that nothing
    a task names can open HTML, a link or a new line in summary.md."""
    text = str(value)
    return f"`{text}`" if re.fullmatch(r"[A-Za-z0-9_.:@+/=-]{1,120}", text) else _md(text)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def markdown(report: dict[str, Any]) -> str:
    """A summary for $GITHUB_STEP_SUMMARY (GitHub-flavoured markdown)."""
    s, k = report["summary"], report["k"]
    agent = report.get("agent") or {}
    ci = s.get("resolved_rate_ci95")
    lines = [
        f"## glm5 bench {_md(report.get('kind'))}: {_md(agent.get('agent'))}"
        + (f" ({_md(agent['model'])})" if agent.get("model") else ""),
        "",
        "| metric | value |",
        "|---|---|",
        f"| resolved | {s['resolved']} / {s['graded']} graded trials ({_pct(s['resolved_rate'])}"
        + (f", 95% CI {_pct(ci[0])} to {_pct(ci[1])}" if ci else "") + ") |",
        f"| pass@1 | {_pct(s['pass@1'])} |",
    ]  # fmt: skip
    if k > 1:
        lines += [f"| pass@{k} | {_pct(s.get(f'pass@{k}'))} |", f"| pass^{k} | {_pct(s.get(f'pass^{k}'))} |"]
    lines += [
        f"| infra errors (not scored) | {s['infra_errors']} |",
        f"| tasks | {s['tasks']} ({s['not_run']} not run) |",
        f"| tokens (prompt / completion) | {s['prompt_tokens']} / {s['completion_tokens']} |",
        f"| cost | ${s['cost_usd']:.4f} |",
        f"| time per trial | {s['seconds_per_trial']} s |" if s["seconds_per_trial"] is not None else "| time | n/a |",
        "",
    ]
    changed = [(tid, sorted({f for a in t["attempts"] if a.get("resolved") for f in a.get("test_config_changed") or ()}))
               for tid, t in report["tasks"].items()]  # fmt: skip
    changed = [(tid, files) for tid, files in changed if files]
    if changed:
        lines += ["_Resolved with the tests' configuration changed by the prediction (graded as the SWE-bench harness "
                  "grades it; such a file can also rewrite what the tests report): "
                  + ", ".join(f"{_code(tid)} ({_md(', '.join(files))})" for tid, files in changed[:50]) + "_", ""]  # fmt: skip
    bad = [(tid, t) for tid, t in report["tasks"].items() if t["status"] != "resolved"]
    if bad:
        lines += ["| task | status | why |", "|---|---|---|"]
        for tid, t in bad[:200]:
            why = next((a.get("reason") for a in reversed(t["attempts"]) if a.get("reason")), "") or ""
            lines.append(f"| {_code(tid)} | {_md(t['status'])} | {_md(why)} |")
        lines.append("")
    if not report.get("complete"):
        lines.append(f"_Incomplete: shards present {_md(', '.join(report['shards']))}; {s['not_run']} task(s) not run._\n")
    return "\n".join(lines)


def write_reports(folder: Path, report: dict[str, Any], junit: Path | None = None) -> None:
    write_json(Path(folder) / "report.json", report)
    (Path(folder) / "junit.xml").write_text(junit_xml(report), encoding="utf-8")
    (Path(folder) / "summary.md").write_text(markdown(report), encoding="utf-8")
    if junit is not None:
        Path(junit).parent.mkdir(parents=True, exist_ok=True)
        Path(junit).write_text(junit_xml(report), encoding="utf-8")


def compare(a: list[Path], b: list[Path]) -> dict[str, Any]:
    ra, rb = build_report(a), build_report(b)
    ta = per_task([{**x, "instance_id": tid} for tid, t in ra["tasks"].items() for x in t["attempts"]])
    tb = per_task([{**x, "instance_id": tid} for tid, t in rb["tasks"].items() for x in t["attempts"]])
    return {"a": {"runs": ra["runs"], "agent": ra["agent"], "summary": ra["summary"]},
            "b": {"runs": rb["runs"], "agent": rb["agent"], "summary": rb["summary"]},
            "difference": paired_difference(ta, tb), "trials": trial_pairs(ra, rb)}  # fmt: skip


def model_calls(trial_dir: str | None) -> list[str] | None:
    """What the model said at each call of a trial's session (content and tool calls), or None without a
    trajectory (another agent, or a trial that never started)."""
    path = Path(trial_dir or "") / "trajectory.jsonl"
    if not trial_dir or not path.is_file():
        return None
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line) if line.strip() else {}
            if isinstance(rec, dict) and rec.get("type") == "model_call":
                msg = ((rec.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
                calls = [c.get("function") for c in msg.get("tool_calls") or []]
                out.append(json.dumps([msg.get("content"), calls], sort_keys=True, default=str))
        except (ValueError, RecursionError, AttributeError, TypeError, IndexError, KeyError):
            out.append("(unreadable line)")  # compared as it is: a torn or hostile line is not a crash
    return out


def trial_pairs(ra: dict[str, Any], rb: dict[str, Any]) -> dict[str, Any]:
    """Trial by trial (a task's attempt i in both runs): how many ended alike, and how many sessions were the same
    call for call. Two seeded runs (`--seed`) of the same model against a deterministic server give the same
    sessions; between two models, the share alike says how far their sampling diverged."""

    def attempts(r):
        return {(tid, int(x["attempt"])): x for tid, t in r["tasks"].items() for x in t["attempts"]}

    xa, xb = attempts(ra), attempts(rb)
    both = [
        k for k in sorted(xa) if k in xb and xa[k].get("resolved") is not None and xb[k].get("resolved") is not None
    ]
    sessions = [(model_calls(xa[k].get("trial_dir")), model_calls(xb[k].get("trial_dir"))) for k in both]
    readable = [(p, q) for p, q in sessions if p is not None and q is not None]
    return {"compared": len(both), "outcomes_alike": sum(xa[k]["resolved"] == xb[k]["resolved"] for k in both),
            "sessions_compared": len(readable), "sessions_alike": sum(p == q for p, q in readable)}  # fmt: skip
