"""The house rules of issue 45, measured: import circles, product files over 500 lines, function bodies over 80.

    python scripts/house_check.py            # the whole product
    python scripts/house_check.py agent serve # only what lies under these packages

Prints one line per breach and exits 1 when there is any. A function's length is its body's (from the first
statement after the docstring to its last line), its signature aside. Imports are counted wherever they stand
(module level or inside a function): a circle hidden in a function is still a circle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("glm5cli", "agent", "model", "finetune", "serve", "plugins")
MAX_FILE_LINES = 500
MAX_BODY_LINES = 80
# task fixtures shipped as data (the built-in suites' own test files) are not product code
FIXTURES = ("plugins/bench_suites/",)


def product_files(root: Path) -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            if rel.startswith(FIXTURES) and "/tests/" in rel or "/solution/" in rel:
                continue
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def _imported(mod: str, f: Path, tree: ast.AST, mods: dict) -> set[str]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    pkg = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            target = resolve(name)
            # a package's __init__ runs before any of its modules: importing it from inside is not a circle
            if target and target != mod and not mod.startswith(target + "."):
                out.add(target)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = fn.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        if len(body) == 1:
            return 0
        first = body[1]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    return fn.end_lineno - start + 1


def breaches(root: Path, only: tuple[str, ...] = ()) -> list[str]:
    mods = product_files(root)
    graph, out = {}, []
    for mod, f in mods.items():
        text = f.read_text()
        tree = ast.parse(text)
        graph[mod] = _imported(mod, f, tree, mods)
        if only and not mod.startswith(only):
            continue
        rel = f.relative_to(root).as_posix()
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            out.append(f"file {rel}: {n} lines (at most {MAX_FILE_LINES})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := _body_lines(node)) > MAX_BODY_LINES:
                out.append(f"function {rel}:{node.lineno} {node.name}: body of {n} lines (at most {MAX_BODY_LINES})")
    for comp in circles(graph):
        if not only or any(m.startswith(only) for m in comp):
            out.append("circle " + " <-> ".join(comp))
    return out


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    found = breaches(root, tuple(argv))
    print("\n".join(found) if found else "the house rules hold")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
