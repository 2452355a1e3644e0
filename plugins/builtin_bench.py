"""The built-in offline benchmark suites, registered through `register_benchmarks` as a third-party plugin would.

    swe:builtin       SWE-bench-format instances over small generated Python repositories (plugins/bench_suites)
    terminal:builtin  Harbor / Terminal-Bench 2.0 task folders that need only coreutils, git and Python
    swe:repair-train, swe:repair-heldout
                      the generated one-line repair family (seed 0) the training proof learns and is measured on
    terminal:repair-train, terminal:repair-heldout
                      the same instances as Harbor task folders
    swe:multilingual  SWE-bench Multilingual-style tasks in Go, Rust, JavaScript, C, PHP and Ruby (--env docker)

`glm5 bench swe --suite builtin` and `glm5 bench terminal --suite builtin` call the suite's
`materialize(dest)` and run what it returns. The suites themselves (bench_suites/) import nothing of `agent`.
"""

from __future__ import annotations

from agent.plugin_registry import hookimpl


@hookimpl
def register_benchmarks(register, context) -> None:
    # the suites (about 40 ms to import) when a suite is asked for: every `glm5 code` session loads the plugins
    from plugins.bench_suites.multilingual_suite import MultilingualSuite
    from plugins.bench_suites.repair_suite import RepairSuite
    from plugins.bench_suites.repair_terminal import RepairTerminalSuite
    from plugins.bench_suites.swe_suite import SWESuite
    from plugins.bench_suites.terminal_suite import TerminalSuite

    suites = (SWESuite(), TerminalSuite(), RepairSuite("train"), RepairSuite("heldout"),
              RepairTerminalSuite("train"), RepairTerminalSuite("heldout"), MultilingualSuite())  # fmt: skip
    for suite in suites:
        register(suite.key, suite)
