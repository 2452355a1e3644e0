"""The built-in SWE-bench Multilingual-style suite ("swe:multilingual"): one small repository per language whose
toolchain installs from Debian's packages (Go, Rust, JavaScript, C, PHP, Ruby, Java), graded with the official
harness's parser for that language (parse_log_gotest, parse_log_cargo, parse_log_tap, parse_log_jq, parse_log_phpunit,
parse_log_ruby_unit, parse_log_maven: Maven offline on Debian's Maven repository).

Data (plugins/bench_suites/multilingual/):
    Dockerfile        the environment of every task: glm5's offline base image plus the toolchains (built by
                      `glm5 bench swe --env docker` from the rows' `dockerfile`; scripts/build_base_image.sh first)
    <language>.toml   a task: repo, owner, version, created_at, problem_statement, test_cmd, log_parser,
                      FAIL_TO_PASS, PASS_TO_PASS, [files] (the base commit), [patch.files], [test_patch.files]
`materialize(dest)` writes dest/repos/<repo>/ (one commit each) and dest/swe-multilingual.jsonl. The tasks need
their toolchains: `--env docker` (local mode has them only where the machine does).
"""

from __future__ import annotations

import json
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from plugins.bench_suites import gitrepo
from plugins.bench_suites.suite import BuiltinSuite
from plugins.bench_suites.swe_suite import SpecError

DATA = Path(__file__).parent / "multilingual"
JSONL = "swe-multilingual.jsonl"
REQUIRED = ("repo", "owner", "version", "created_at", "problem_statement", "test_cmd", "log_parser")


def load_task(path: Path) -> dict:
    try:
        d = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{path}: {e}") from None
    for k in REQUIRED:
        if not isinstance(d.get(k), str) or not d[k]:
            raise SpecError(f"{path}: `{k}` must be a non-empty string")
    for k in ("files",):
        if not isinstance(d.get(k), dict) or not d[k]:
            raise SpecError(f"{path}: [{k}] must map paths to file text")
    for k in ("patch", "test_patch"):
        if not isinstance((d.get(k) or {}).get("files"), dict):
            raise SpecError(f"{path}: [{k}.files] must map paths to file text")
    if not d.get("FAIL_TO_PASS"):
        raise SpecError(f"{path}: `FAIL_TO_PASS` is empty: the tests must expose the bug")
    return d


def build_task(d: dict, path: Path, final: Path, dockerfile: str) -> dict:
    gitrepo.init(path)
    files = dict(d["files"])
    gitrepo.write_files(path, files)
    base = gitrepo.commit(path, f"{d['repo']} {d['version']}", d["created_at"])
    fixed, tested = {**files, **d["patch"]["files"]}, {**files, **d["test_patch"]["files"]}
    return {
        "repo": str(final), "instance_id": f"{d['owner']}__{d['repo']}-1", "base_commit": base,
        "patch": gitrepo.diff(files, fixed), "test_patch": gitrepo.diff(files, tested),
        "problem_statement": d["problem_statement"], "created_at": d["created_at"], "version": d["version"],
        "FAIL_TO_PASS": json.dumps(d["FAIL_TO_PASS"]), "PASS_TO_PASS": json.dumps(d.get("PASS_TO_PASS", [])),
        "environment_setup_commit": base, "test_cmd": d["test_cmd"], "log_parser": d["log_parser"],
        "eval_type": "pass_and_fail", "dockerfile": dockerfile, "language": d.get("language", ""),
    }  # fmt: skip


class MultilingualSuite(BuiltinSuite):
    kind = "swe"
    name = "multilingual"
    description = ("Offline SWE-bench Multilingual-style tasks in Go, Rust, JavaScript, C, PHP, Ruby and Java, graded "
                   "with the official harness's parsers; run with --env docker (toolchains from Debian packages)")  # fmt: skip

    def build(self, tmp: Path, dest: Path) -> list[str]:
        dockerfile = (DATA / "Dockerfile").read_text(encoding="utf-8")
        rows = []
        for p in sorted(DATA.glob("*.toml")):
            d = load_task(p)
            rows.append(build_task(d, tmp / "repos" / d["repo"], dest / "repos" / d["repo"], dockerfile))
        (tmp / JSONL).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return ["repos", JSONL]

    def outputs(self, dest: Path, names: list[str]) -> list[Path]:
        return [dest / JSONL]
