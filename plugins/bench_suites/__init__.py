"""The built-in offline benchmark suites (registered by plugins/builtin_bench.py).

    suite.py           BuiltinSuite: materialize(dest) once, atomically, under a lock; reused while the data is unchanged
    gitrepo.py         deterministic git (no user config or hooks, fixed identity and dates), diffs made outside the repo
    swe_suite.py       SWESuite ("swe:builtin"): swe/repos/*.toml + swe/instances/*.toml -> git repos + SWE-bench JSONL
    repair_family.py   the generated one-line repair family: instance = f(seed, split, index); splits share no name
    repair_suite.py    RepairSuite ("swe:repair-train", "swe:repair-heldout"): that family as repos + SWE-bench JSONL
    repair_terminal.py RepairTerminalSuite ("terminal:repair-train", "terminal:repair-heldout"): the same instances as
                       Harbor task folders, from the template repair_terminal_task/
    terminal_suite.py  TerminalSuite ("terminal:builtin"): terminal/<task>/ Harbor folders, /app state built at materialize
    multilingual_suite.py MultilingualSuite ("swe:multilingual"): multilingual/<language>.toml -> repos + JSONL with
                       the harness's parser per language and the toolchains' Dockerfile

README.md says how to add an instance or a task and how to check it.

A suite is any object with `kind`, `name`, `description`, `deterministic` and `materialize(dest) -> list[Path]`
(the SWE suite returns [the JSONL]; the terminal suite its task folders). The data lives in text files beside the
code, not in Python: swe/, terminal/ and repair_terminal_task/. Same data, same bytes and the same commit SHAs on every machine.
"""
