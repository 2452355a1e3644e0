"""A generated family of one-line repair tasks: random small Python packages, one planted bug, seeded and split.

Each instance is a package of two modules with two or three short functions each (names, arguments, constants
drawn at random), tests for every function, and one bug of one of four kinds, each fixed by a one-line edit:

    wrong_operator    `return a - b` where `a + b` was meant (also in a loop's update)
    off_by_one        `return <expr> + 1` (or `- 1`) where `<expr>` was meant
    wrong_comparison  `x < K` where `x <= K` was meant (and the reverse, and > / >=)
    wrong_return      `return hi` where `return lo` was meant

The issue text names the file, the function and the failing test, and quotes the buggy line and what it should
be (stripped), in one of several phrasings: a reader (or a small model) can check the line in the file and make
the edit without seeing the tests' hidden case. The quoted line occurs once in its file, so the edit tool can
target it as quoted.

Splits share no instance and no function name: every (verb, noun) function name is assigned to exactly one
split by a hash, so held-out tasks are about functions the train split never shows. The third split, `dev`, is a
development set for choosing training settings without looking at the held-out split: instances of its own (its
own random stream) drawn from the held-out split's names, so it measures what the held-out split measures
(functions training never shows) without sharing an instance with it. An instance is a pure function of
(seed, split, index): the same arguments give the same files on every machine.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field

SPLITS = ("train", "heldout", "dev")
KINDS = ("wrong_operator", "off_by_one", "wrong_comparison", "wrong_return")

VERBS = ("scale", "count", "merge", "clamp", "shift", "blend", "weigh", "score", "total", "offset", "pad", "trim",
         "rank", "bound", "step", "mix", "pack", "tally", "measure", "adjust", "limit", "convert", "rate", "grade",
         "price", "charge", "fold", "round", "check", "split")  # fmt: skip
NOUNS = ("items", "tokens", "rows", "cells", "points", "bytes", "pages", "users", "orders", "steps", "words", "files",
         "blocks", "lines", "nodes", "edges", "tasks", "jobs", "votes", "coins", "miles", "frames", "ticks", "slots",
         "seats", "boxes", "cards", "packets", "hits", "bids")  # fmt: skip
MODULES = ("billing", "inventory", "metrics", "geometry", "ledger", "schedule", "routing", "storage", "stats",
           "timing", "grading", "pricing", "shipping", "quota", "budget", "catalog", "payroll", "survey", "traffic",
           "weather")  # fmt: skip
PACKAGES = ("corelib", "mathkit", "datakit", "tallyho", "numly", "calcpy", "opskit", "sumwise", "gridlib", "pyledger",
            "countly", "metrix")  # fmt: skip
ARGS = ("a", "b", "x", "y", "n", "m", "size", "value", "width", "base", "rate", "amount", "qty", "start", "total_in")
HELD_OUT_SHARE = 5  # one function name in five belongs to the held-out split
NAMES_OF = {"dev": "heldout"}  # a split that draws its function names from another split's pool


def name_split(name: str) -> str:
    """The split a function name belongs to: a fixed hash, the same for every seed and every count."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return "heldout" if h % HELD_OUT_SHARE == 0 else "train"


@dataclass
class Function:
    """One function: its source when correct, and (for the planted one) when buggy with the issue's facts."""

    name: str
    args: list[str]
    lines: list[str]  # the body, indented four spaces
    kind: str = ""  # the bug kind planted here ("" when correct)
    line_no: int = -1  # which body line the bug is on
    bad_line: str = ""
    old: str = ""  # the buggy line and the fixed one, stripped, as the issue quotes them
    new: str = ""

    def source(self, buggy: bool = False) -> str:
        body = list(self.lines)
        if buggy and self.kind:
            body[self.line_no] = self.bad_line
        return f"def {self.name}({', '.join(self.args)}):\n" + "\n".join(body) + "\n"


def _pick_args(rng: random.Random, k: int) -> list[str]:
    return rng.sample(ARGS, k)


def _binop(rng: random.Random, name: str) -> Function:
    a, b = _pick_args(rng, 2)
    op = rng.choice(["+", "-", "*"])
    return Function(name, [a, b], [f"    return {a} {op} {b}"])


def _affine(rng: random.Random, name: str) -> Function:
    (x,) = _pick_args(rng, 1)
    k, c = rng.randint(2, 9), rng.randint(2, 9)
    return Function(name, [x], [f"    return {x} * {k} + {c}"])


def _accumulate(rng: random.Random, name: str) -> Function:
    xs, t = rng.sample(["values", "items", "parts", "counts", "sizes"], 1)[0], rng.choice(["acc", "result", "out"])
    return Function(name, [xs], [f"    {t} = 0", f"    for v in {xs}:", f"        {t} = {t} + v", f"    return {t}"])


def _predicate(rng: random.Random, name: str) -> Function:
    (x,) = _pick_args(rng, 1)
    cmp, k = rng.choice(["<", "<=", ">", ">="]), rng.randint(3, 60)
    return Function(name, [x], [f"    if {x} {cmp} {k}:", "        return True", "    return False"])


def _pick(rng: random.Random, name: str) -> Function:
    a, b = _pick_args(rng, 2)
    want = rng.choice(["lo", "hi"])
    return Function(name, [a, b], [f"    lo = min({a}, {b})", f"    hi = max({a}, {b})", f"    return {want}"])


SHAPES = {"binop": _binop, "affine": _affine, "accumulate": _accumulate, "predicate": _predicate, "pick": _pick}
# which bug kinds each shape can carry
CAN_CARRY = {
    "wrong_operator": ("binop", "accumulate"),
    "off_by_one": ("binop", "affine", "accumulate"),
    "wrong_comparison": ("predicate",),
    "wrong_return": ("pick",),
}
_SWAP_OP = {"+": ["-", "*"], "-": ["+"], "*": ["+"]}
_SWAP_CMP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}


def plant(fn: Function, kind: str, rng: random.Random) -> None:
    """Put a bug of `kind` on one line of fn; record the buggy line and the lines the issue quotes."""
    if kind == "wrong_operator":
        i = next(j for j, line in enumerate(fn.lines) if " + " in line or " - " in line or " * " in line)
        right = next(op for op in ("+", "-", "*") if f" {op} " in fn.lines[i])
        bad = fn.lines[i].replace(f" {right} ", f" {rng.choice(_SWAP_OP[right])} ", 1)
    elif kind == "off_by_one":
        i = next(j for j, line in enumerate(fn.lines) if line.strip().startswith("return "))
        bad = f"{fn.lines[i]} {rng.choice(['+', '-'])} 1"
    elif kind == "wrong_comparison":
        i = 0
        right = next(c for c in (">=", "<=", ">", "<") if f" {c} " in fn.lines[0])
        bad = fn.lines[0].replace(f" {right} ", f" {_SWAP_CMP[right]} ", 1)
    elif kind == "wrong_return":
        i = len(fn.lines) - 1
        right = fn.lines[i].split()[-1]
        bad = fn.lines[i].replace(right, "hi" if right == "lo" else "lo")
    else:
        raise ValueError(f"unknown bug kind {kind!r}; expected one of {', '.join(KINDS)}")
    # what the issue quotes: the whole line as it is and as it should be, without its indentation
    fn.old, fn.new = bad.strip(), fn.lines[i].strip()
    fn.kind, fn.line_no, fn.bad_line = kind, i, bad


def call_args(fn: Function, rng: random.Random) -> list[tuple]:
    """Argument tuples that exercise fn (and, for the buggy one, tell the bug from the fix)."""
    if any("for v in" in line for line in fn.lines):
        return [([rng.randint(1, 9) for _ in range(rng.randint(2, 4))],) for _ in range(3)]
    if fn.lines[0].lstrip().startswith("if"):
        k = int(fn.lines[0].split()[-1].rstrip(":"))
        return [(k,), (k - rng.randint(1, 5),), (k + rng.randint(1, 5),)]
    return [tuple(rng.randint(2, 20) for _ in fn.args) for _ in range(3)]


@functools.lru_cache(maxsize=4096)
def _compiled(source: str, name: str):
    scope: dict = {}
    exec(compile(source, f"<{name}>", "exec"), scope)  # our own generated code, never task input
    return scope[name]


def evaluate(source: str, name: str, args: tuple):
    return _compiled(source, name)(*args)


@dataclass
class Instance:
    """One generated task: files before the fix, the fix, the hidden test, and the issue's facts."""

    instance_id: str
    split: str
    package: str
    modules: dict[str, list[Function]] = field(default_factory=dict)
    buggy: tuple[str, str] = ("", "")  # (module, function name)
    problem_statement: str = ""
    visible_tests: dict[str, str] = field(default_factory=dict)  # path -> text (shipped in the repo)
    hidden_test: tuple[str, str] = ("", "")  # (path, text appended by the test patch)
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)

    @property
    def bug(self) -> Function:
        return next(f for f in self.modules[self.buggy[0]] if f.name == self.buggy[1])

    @property
    def path(self) -> str:
        return f"{self.package}/{self.buggy[0]}.py"

    def files(self, fixed: bool) -> dict[str, str]:
        out = {f"{self.package}/__init__.py": f'"""{self.package}: small helpers."""\n'}
        for mod, fns in self.modules.items():
            out[f"{self.package}/{mod}.py"] = "\n\n".join(f.source(buggy=not fixed) for f in fns)
        out.update(self.visible_tests)
        return out


# Every phrasing quotes the line as it is and as it should be (stripped), as a careful bug report does: once the
# file has been read, the fix is a copy from the issue into an edit, with no search of the file (what that did for
# the proof's model: benchmarks/RESULTS.md, "The training proof").
STATEMENTS = {
    "wrong_operator": [
        "`{f}` in `{path}` uses the wrong operator: `{call}` returns {got}, expected {want}. The line `{old}` should "
        "be `{new}`. The failing test is `{test}`.",
        "Wrong operator in `{f}` ({path}): `{call}` gives {got} instead of {want}; `{old}` should read `{new}`. "
        "See `{test}`.",
    ],
    "off_by_one": [
        "`{f}` in `{path}` is off by one: `{call}` returns {got}, expected {want}. The line `{old}` should be "
        "`{new}`. The failing test is `{test}`.",
        "Off-by-one in `{f}` ({path}): `{call}` gives {got} instead of {want}; `{old}` should read `{new}`. "
        "See `{test}`.",
    ],
    "wrong_comparison": [
        "`{f}` in `{path}` gets a boundary wrong: `{call}` returns {got}, expected {want}. The line `{old}` should "
        "be `{new}`. The failing test is `{test}`.",
        "Boundary bug in `{f}` ({path}): `{call}` gives {got} instead of {want}; `{old}` should read `{new}`. "
        "See `{test}`.",
    ],
    "wrong_return": [
        "`{f}` in `{path}` returns the wrong value: `{call}` returns {got}, expected {want}. The line `{old}` "
        "should be `{new}`. The failing test is `{test}`.",
        "Wrong return value in `{f}` ({path}): `{call}` gives {got} instead of {want}; `{old}` should read "
        "`{new}`. See `{test}`.",
    ],
}


@functools.cache
def name_pool(split: str) -> tuple[str, ...]:
    """Every function name `split` draws from, in a fixed order."""
    split = NAMES_OF.get(split, split)
    return tuple(f"{v}_{n}" for v in VERBS for n in NOUNS if name_split(f"{v}_{n}") == split)


def _names(rng: random.Random, split: str, k: int) -> list[str]:
    return rng.sample(name_pool(split), k)


def _test_fn(fn: Function, cases: list[tuple], suffix: str = "") -> str:
    lines = [f"def test_{fn.name}{suffix}():"]
    for args in cases:
        want = evaluate(fn.source(), fn.name, args)
        lines.append(f"    assert {fn.name}({', '.join(map(repr, args))}) == {want!r}")
    return "\n".join(lines) + "\n"


def generate(seed: int, split: str, index: int) -> Instance:
    """Instance `index` of `split` for `seed`: a pure function of the three."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    rng = random.Random(f"glm5-repair:{seed}:{split}:{index}")
    for _ in range(100):
        inst = _draw(rng, split, index)
        # the edit tool replaces a unique string: the line the issue quotes must occur once in its file
        if inst.files(fixed=False)[inst.path].count(inst.bug.old) == 1:
            _check_and_describe(inst, rng)
            return inst
    raise RuntimeError(f"instance {index} of {split}: no draw with a unique buggy line")


def _draw(rng: random.Random, split: str, index: int) -> Instance:
    pkg = rng.choice(PACKAGES)
    mods = rng.sample(MODULES, 2)
    counts = [rng.randint(2, 3) for _ in mods]
    names = iter(_names(rng, split, sum(counts)))
    kind = KINDS[index % len(KINDS)]  # balanced kinds; everything else is drawn
    inst = Instance(f"glm5proof__repair-{split}-{index:04d}", split, pkg)
    bug_module = rng.randrange(len(mods))
    for m, (mod, count) in enumerate(zip(mods, counts, strict=True)):
        fns = []
        for j in range(count):
            is_bug = m == bug_module and j == 0
            shape = rng.choice(CAN_CARRY[kind]) if is_bug else rng.choice(sorted(SHAPES))
            fn = SHAPES[shape](rng, next(names))
            if is_bug:
                plant(fn, kind, rng)
                inst.buggy = (mod, fn.name)
            fns.append(fn)
        rng.shuffle(fns)
        inst.modules[mod] = fns
    for mod, fns in inst.modules.items():
        test_path = f"tests/test_{mod}.py"
        imports = f"from {pkg}.{mod} import {', '.join(f.name for f in fns)}\n"
        inst.visible_tests[test_path] = imports + "".join("\n\n" + _test_fn(f, call_args(f, rng)) for f in fns)
        for f in fns:
            (inst.fail_to_pass if f.kind else inst.pass_to_pass).append(f"{test_path}::test_{f.name}")
    return inst


def _check_and_describe(inst: Instance, rng: random.Random) -> None:
    """Make sure the visible and hidden tests fail on the bug (re-drawing cases if not) and write the issue."""
    fn, mod = inst.bug, inst.buggy[0]
    test_path = f"tests/test_{mod}.py"
    for _ in range(50):
        visible = call_args(fn, rng)
        hidden = call_args(fn, rng)
        diff = [a for a in visible if evaluate(fn.source(), fn.name, a) != evaluate(fn.source(True), fn.name, a)]
        if diff and any(evaluate(fn.source(), fn.name, a) != evaluate(fn.source(True), fn.name, a) for a in hidden):
            break
    else:
        raise RuntimeError(f"{inst.instance_id}: no inputs tell the bug from the fix")
    text = inst.visible_tests[test_path]
    start = text.index(f"def test_{fn.name}():")
    end = text.find("\n\n\ndef ", start)
    end = len(text) if end < 0 else end + 1
    inst.visible_tests[test_path] = text[:start] + _test_fn(fn, visible) + text[end:]
    inst.hidden_test = (test_path, "\n\n" + _test_fn(fn, hidden, "_more"))
    inst.fail_to_pass.append(f"{test_path}::test_{fn.name}_more")
    example = diff[0]
    inst.problem_statement = rng.choice(STATEMENTS[fn.kind]).format(
        f=fn.name, path=inst.path, old=fn.old, new=fn.new, test=f"{test_path}::test_{fn.name}",
        call=f"{fn.name}({', '.join(map(repr, example))})", got=evaluate(fn.source(True), fn.name, example),
        want=evaluate(fn.source(), fn.name, example),
    )  # fmt: skip
