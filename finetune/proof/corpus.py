"""The base model's corpus: synthetic agent conversations over random code, in OpenAI chat JSONL.

A model trained from scratch must first learn the chat format, the tool-call syntax and the shape of a session
before it can learn to repair anything. These conversations teach exactly that, with the deployed system prompt
and tool schemas (taken from a session the bench recorded, so the base sees the prefix it will be served with),
over packages drawn like the repair family's but with no bug, no failing test and no issue text:

    show      "Show me `pkg/mod.py`."                  read -> a one-line summary of its functions
    tests     "Run the tests in `tests/test_mod.py`."  bash (pytest) -> how many passed
    rename    "In `pkg/mod.py`, rename `f` to `g`."    read -> edit (the def line) -> done
    find      "Which files define tests?"              glob -> the list

The forgetting stage's data is the same generator with renames only (`kinds=("rename",)`): another task kind.
Only train-split function names are used, so the base never sees a held-out function. Tool results have the
tools' real formats (`cat -n` numbering, "[exit code 0]", "edited PATH: 1 replacement"). `glm5 finetune sft --full`
trains on it like on any OpenAI chat JSONL.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from plugins.bench_suites.repair_family import MODULES, PACKAGES, SHAPES, name_pool

KINDS = ("show", "tests", "rename", "find")


def _call(name: str, args: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _assistant_call(name: str, args: dict[str, Any], n: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [_call(name, args, n)]}


def _tool(text: str, n: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{n}", "content": text}


def _listing(text: str) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(text.splitlines(), 1))


def conversation(rng: random.Random, system: str, kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    """One synthetic session of one of `kinds`: system, user, the tool calls and their results, the answer."""
    pkg, mod = rng.choice(PACKAGES), rng.choice(MODULES)
    fns = [SHAPES[rng.choice(sorted(SHAPES))](rng, name) for name in rng.sample(name_pool("train"), rng.randint(2, 3))]
    path, test_path = f"{pkg}/{mod}.py", f"tests/test_{mod}.py"
    source = "\n\n".join(f.source() for f in fns)
    kind = rng.choice(kinds)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    if kind == "show":
        msgs.append({"role": "user", "content": rng.choice(["Show me `{p}`.", "What is in `{p}`?"]).format(p=path)})
        msgs += [_assistant_call("read", {"path": path}, 0), _tool(_listing(source), 0)]
        names = ", ".join(f"`{f.name}`" for f in fns)
        msgs.append({"role": "assistant", "content": f"`{path}` defines {names}."})
    elif kind == "tests":
        msgs.append({"role": "user", "content": f"Run the tests in `{test_path}`."})
        command = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider {test_path}"
        msgs.append(_assistant_call("bash", {"command": command}, 0))
        n = len(fns)
        msgs.append(_tool(f"{'.' * n:<72} [100%]\n{n} passed in 0.0{rng.randint(1, 9)}s\n[exit code 0]", 0))
        msgs.append({"role": "assistant", "content": f"All {n} tests in `{test_path}` pass."})
    elif kind == "rename":
        f = rng.choice(fns)
        new = rng.choice([n for n in name_pool("train") if n not in {g.name for g in fns}])
        msgs.append({"role": "user", "content": f"In `{path}`, rename `{f.name}` to `{new}`."})
        msgs += [_assistant_call("read", {"path": path}, 0), _tool(_listing(source), 0)]
        old_def = f"def {f.name}({', '.join(f.args)}):"
        new_def = f"def {new}({', '.join(f.args)}):"
        msgs += [_assistant_call("edit", {"path": path, "old_string": old_def, "new_string": new_def}, 1),
                 _tool(f"edited {path}: 1 replacement", 1)]  # fmt: skip
        msgs.append({"role": "assistant", "content": f"Renamed `{f.name}` to `{new}` in `{path}`."})
    else:
        msgs.append({"role": "user", "content": "Which files hold tests?"})
        msgs += [_assistant_call("glob", {"pattern": "tests/test_*.py"}, 0), _tool(test_path, 0)]
        msgs.append({"role": "assistant", "content": f"The tests are in `{test_path}`."})
    return msgs


def write_corpus(out: Path, n: int, seed: int, system: str, tools: list[dict[str, Any]],
                 kinds: tuple[str, ...] = KINDS) -> Path:  # fmt: skip
    """Write n conversations to out (OpenAI chat JSONL, one {messages, tools} a line), atomically."""
    rng = random.Random(f"glm5-proof-corpus:{seed}:{','.join(kinds)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps({"messages": conversation(rng, system, kinds), "tools": tools}) + "\n")
    tmp.replace(out)
    return out


def deployed_prompt(bench_run: Path) -> tuple[str, list[dict[str, Any]]]:
    """The system prompt and tool schemas of a session `glm5 bench` recorded in bench_run."""
    for traj in sorted(Path(bench_run).glob("trials/*/*/trajectory.jsonl")):
        system, tools = None, None
        for line in traj.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("type") == "session":
                tools = rec.get("tools")
            elif rec.get("type") == "message" and rec["message"].get("role") == "system":
                system = rec["message"]["content"]
            if system is not None and tools is not None:
                return system, tools
    raise FileNotFoundError(f"{bench_run}: no recorded session with a system prompt and tools")


def write_turn_prompts(bench_run: Path, out: Path, thinking: bool = True) -> Path:
    """The distillation's prompts: every turn of each recorded session, as the context the agent sent the model
    for it (system prompt, the issue, the earlier calls and tool results, the tool schemas), one
    `{"messages", "tools"}` a line, the format `glm5 finetune distill --prompts` reads (with
    `"chat_template_kwargs": {"enable_thinking": false}` when thinking is off, as the sessions were served). A
    session's first turn alone would teach only its first call (the `read`): the repair is written turns later,
    after the file's listing. Every session counts, solved or not: a context does not depend on how the session
    ended."""
    rows = []
    for traj in sorted(Path(bench_run).glob("trials/*/*/trajectory.jsonl")):
        msgs: list[dict[str, Any]] = []
        tools: list[dict[str, Any]] = []
        for line in traj.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("type") == "session":
                tools = rec.get("tools") or []
            elif rec.get("type") == "message":
                msg = rec["message"]
                if msg.get("role") == "assistant" and [m["role"] for m in msgs[:2]] == ["system", "user"]:
                    row: dict[str, Any] = {"messages": list(msgs), "tools": tools}
                    if not thinking:
                        row["chat_template_kwargs"] = {"enable_thinking": False}
                    rows.append(row)
                msgs.append(msg)
    if not rows:
        raise FileNotFoundError(f"{bench_run}: no recorded session with a system prompt and a first user turn")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(out)
    return out


_OPERATORS = ((" + ", " - ", " * "), (" < ", " <= ", " > ", " >= "))


def _variant(line: str, rng: random.Random) -> str:
    """`line` with one operator changed for another of its kind, or `+ 1` appended."""
    present = [(op, kind) for kind in _OPERATORS for op in kind if op in line]
    if not present:
        return f"{line} + 1"
    op, kind = rng.choice(present)
    return line.replace(op, rng.choice([o for o in kind if o != op]), 1)


# words the repair family never uses: function names made of them are new to every split, so a drill that quotes
# one teaches copying an unseen name (a held-out task's) without showing any held-out name
FRESH_VERBS = ("brew", "carve", "dock", "etch", "fetch", "gauge", "hatch", "ink", "jolt", "knit", "lace", "mend",
               "nudge", "pluck", "quench", "rake", "sift", "tame", "untie", "vent", "wedge", "yank", "zip", "bake",
               "coil", "drape", "fling", "glaze", "hoist", "jam")  # fmt: skip
FRESH_NOUNS = ("apples", "badges", "cables", "dials", "eggs", "flags", "gears", "hinges", "icons", "jars", "kites",
               "lamps", "masks", "nets", "oars", "pins", "quilts", "reels", "sails", "tents", "urns", "vials",
               "wires", "yarns", "zones", "bolts", "clips", "drums", "forks", "gloves")  # fmt: skip


def made_up_word(rng: random.Random, avoid: set[str] | frozenset[str] = frozenset()) -> str:
    """A pronounceable nonsense word of 2-3 syllables (no vocabulary to memorise), drawn again while in `avoid`."""
    while True:
        w = "".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 3)))
        if w not in avoid:
            return w


def write_drills(out: Path, n: int, seed: int, in_code: float = 0.0, fresh_names: float = 0.0,
                 nonsense: float = 0.0, numbers: float = 0.0) -> Path:  # fmt: skip
    """n copy drills (OpenAI chat JSONL), each asking for something quoted back verbatim: "Echo `X`." answered
    with X, where X is a path, a test id, a function name or a line of code drawn like the sessions' (train-split
    names only); or two quoted lines ("Replace `X` with `Y`.") answered with both in order. No system prompt and
    no tools: ~25 tokens each, so packed rows hold dozens and a small model sees thousands of copies per step. A
    session's first act is a copy (the path the user names into `read`), and a repair's edit copies the two lines
    its issue quotes: a model that learned only to copy paths writes the edit's `old_string` from memory.

    A share `in_code` of all drills are pairs with code around them, as a repair's do: a block of two or three of the
    family's functions holding X and lines that differ from X in one operator, so the lines to copy are found
    among look-alikes with the same names (a model trained on bare pairs copied the names and wrote the family's
    usual operators and numbers).

    A share `fresh_names` of the function names drawn are new to every split: half made of words the family never
    uses (FRESH_VERBS x FRESH_NOUNS), half of nonsense syllables. The base trained on train names only copied them
    (22/24) but not one name of unseen words (0/24): it wrote a train name where a new one was quoted. At 0.5 the
    base learnt the fresh words as one more vocabulary and still copied no unseen name (ProofConfig keeps it off).

    A share `nonsense` of the drills have every function name, argument and most paths in them made up: nonsense
    words, alone or beside one of the family's words (`scale_vokiru`, `pelaso_items`), never a name of either
    split, drawn afresh for each drill. No vocabulary can answer them: only a copy from the prompt can, which is
    what a held-out task asks of the model (its function names are combinations train never shows). From scratch,
    at 0.5 the 300-step dense base copied none of them (0/40) and fewer train names (18/40 against 36/40); at 1.0
    alone (the proof's copy phase, RUN/corpus/copy.jsonl) the model learns to copy (21/40 after 400 steps), and
    0.5 in the corpus after it keeps that (ProofConfig.drill_nonsense).

    A share `numbers` of the drills are a comparison line with its constant (`if qty >= 39:`, the line a
    wrong_comparison issue quotes), echoed (2 in 5) or as a pair with another operator: the base echoed such a line
    28/40 times against a path 40/40, and SFT's failed sessions mis-copied the number. At 0 no draw changes: the
    drills are those of a run without it."""
    drills = _Drills(random.Random(f"glm5-proof-drills:{seed}"), fresh_names)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for _ in range(n):
            ask, answer = drills.drill(in_code, nonsense, numbers)
            f.write(json.dumps({"messages": [{"role": "user", "content": ask},
                                             {"role": "assistant", "content": answer}]}) + "\n")  # fmt: skip
    tmp.replace(out)
    return out


class _Drills:
    """write_drills' draws, in one random stream: names (train's, fresh, or made up for this drill), functions
    of the family's shapes, lines, items to echo, pairs in code and comparison lines."""

    def __init__(self, rng: random.Random, fresh_names: float):
        self.rng, self.fresh_names = rng, fresh_names
        self.pool = name_pool("train")
        self.family_words = {w for split in ("train", "heldout") for n in name_pool(split) for w in n.split("_")}
        self.verbs = sorted({n.split("_")[0] for n in self.pool})
        self.nouns = sorted({n.split("_")[1] for n in self.pool})
        self.made_up = False  # this drill's names and arguments are nonsense

    def drill(self, in_code: float, nonsense: float, numbers: float) -> tuple[str, str]:
        """The next drill: (the user's ask, the answer)."""
        rng = self.rng
        self.made_up = bool(nonsense) and rng.random() < nonsense
        k = rng.random()
        if numbers and rng.random() < numbers:
            return self.number_drill()
        if k < in_code:
            return self.in_code_pair()
        if k < in_code + 0.2:  # two lines, often one a near copy of the other (which to write where?)
            x = self.line()
            y = self.line() if rng.random() < 0.5 else _variant(x, rng)
            return rng.choice(["Replace `{}` with `{}`.", "`{}` should read `{}`."]).format(x, y), f"{x}\n{y}"
        answer = self.item()
        return rng.choice(["Echo `{}`.", "Repeat `{}`.", "Say `{}` back."]).format(answer), answer

    def word(self) -> str:
        return made_up_word(self.rng)

    def nonsense_word(self) -> str:
        return made_up_word(self.rng, avoid=self.family_words)

    def name(self) -> str:
        rng, fresh_names = self.rng, self.fresh_names
        if self.made_up:
            k = rng.random()
            if k < 1 / 3:
                return f"{rng.choice(self.verbs)}_{self.nonsense_word()}"
            if k < 2 / 3:
                return f"{self.nonsense_word()}_{rng.choice(self.nouns)}"
            return f"{self.nonsense_word()}_{self.nonsense_word()}"
        if fresh_names and rng.random() < fresh_names:
            if rng.random() < 0.5:
                return f"{rng.choice(FRESH_VERBS)}_{rng.choice(FRESH_NOUNS)}"
            while True:  # a nonsense word can spell one of the family's ("rate", "pages"): drawn again
                verb, noun = self.word(), self.word() + "s"
                if not {verb, noun} & self.family_words:
                    return f"{verb}_{noun}"
        return rng.choice(self.pool)

    def function(self) -> list[str]:
        rng = self.rng
        fn = rng.choice(list(SHAPES.values()))(rng, self.name())
        rows = [f"def {fn.name}({', '.join(fn.args)}):", *fn.lines]
        if self.made_up:  # its arguments renamed too
            new = {a: self.nonsense_word()[: rng.randint(1, 6)] for a in fn.args}
            rows = [re.sub(r"\b\w+\b", lambda m: new.get(m.group(), m.group()), r) for r in rows]
        return rows

    def line(self) -> str:
        return self.rng.choice(self.function()).strip()

    def item(self) -> str:
        rng = self.rng
        k = rng.random()
        if self.made_up and k < 0.35:  # a path of made-up words: a file a task names
            if k < 0.25:
                return f"{self.nonsense_word()}/{self.nonsense_word()}.py"
            return f"tests/test_{self.nonsense_word()}.py"
        if k < 0.25:
            return f"{rng.choice(PACKAGES)}/{rng.choice(MODULES)}.py"
        if k < 0.35:
            return f"tests/test_{rng.choice(MODULES)}.py"
        if k < 0.45:
            return self.name()
        if k < 0.55:
            return f"tests/test_{rng.choice(MODULES)}.py::test_{self.name()}"
        return self.line()

    def in_code_pair(self) -> tuple[str, str]:
        rng = self.rng
        unique: list[int] = []
        while not unique:  # x occurs once in the block, as an edit's old_string must
            rows = [row for _ in range(rng.randint(2, 3)) for row in self.function()]
            body = [row.strip() for row in rows if not row.startswith("def ")]
            unique = [j for j, row in enumerate(rows) if not row.startswith("def ") and body.count(row.strip()) == 1]
        i = rng.choice(unique)
        x, y = rows[i].strip(), _variant(rows[i].strip(), rng)
        indent = rows[i][: len(rows[i]) - len(rows[i].lstrip())]
        alikes = {_variant(x, rng) for _ in range(4)} | {f"{x} - 1"}
        alikes -= {x, y}  # look-alikes elsewhere in the block: neither line itself
        for alike in sorted(alikes)[: rng.randint(1, 2)]:
            rows.insert(rng.randint(1, len(rows)), indent + alike)
        ask = rng.choice(["Replace `{}` with `{}`.", "`{}` should read `{}`."]).format(x, y)
        code = "```python\n" + "\n".join(rows) + "\n```"
        return (f"{code}\n\n{ask}" if rng.random() < 0.5 else f"{ask}\n\n{code}"), f"{x}\n{y}"

    def number_drill(self) -> tuple[str, str]:
        rng = self.rng
        fn = SHAPES["predicate"](rng, self.name())
        x = fn.lines[0].strip()  # `if qty >= 39:`
        op = x.split()[2]
        y = x.replace(f" {op} ", f" {rng.choice([o for o in _OPERATORS[1] if o.strip() != op]).strip()} ", 1)
        if rng.random() < 0.4:
            return rng.choice(["Echo `{}`.", "Repeat `{}`.", "Say `{}` back."]).format(x), x
        return rng.choice(["Replace `{}` with `{}`.", "`{}` should read `{}`."]).format(x, y), f"{x}\n{y}"
