"""What the user types besides tasks: slash commands, `!command` and `@file` mentions. Interface-independent.

    /help               this list
    /undo               undo the last turn: code and conversation
    /rewind [N]         without N: list the turns; with N: undo the last N turns
    /diff               what this session changed in the working tree so far
    /compact [focus]    summarize the conversation now (instruction files are put back)
    /model [NAME]       show or switch the model
    /mode [MODE]        show or switch the permission mode (ask, accept-edits, plan, auto)
    /cost               tokens and cost so far
    /sessions           recent sessions in this repository
    /exit               leave
`!cmd` runs a shell command yourself (no approval: you typed it); its output joins the conversation so the model
sees it. `@path` in a task attaches that file's content and counts as the model having read it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from agent.git_safe import git
from agent.session import list_sessions
from agent.settings import MODES

MAX_MENTION_BYTES = 100_000
_MENTION = re.compile(r"(?<![\w`])@([\w./\-]+)")


@dataclass
class CommandResult:
    text: str
    exit: bool = False
    error: bool = False
    diff: bool = False  # `text` is a unified diff (the TUI colours it)


def help_text() -> str:
    body = __doc__.split("\n\n", 1)[1].strip("\n")
    return "\n".join(line.removeprefix("    ") for line in body.splitlines())


def handle(session: Any, line: str) -> CommandResult:
    """Run one slash command against a session."""
    agent = session.agent
    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    try:
        if name == "/help":
            return CommandResult(help_text())
        if name == "/exit":
            return CommandResult("bye", exit=True)
        if name == "/undo":
            if not agent.turns:
                return CommandResult("nothing to undo", error=True)
            rec = agent.rewind(1)
            return CommandResult(f"undid the latest turn (turn {rec['to_turn']}): code and conversation restored"
                                 + _saved(rec))  # fmt: skip
        if name == "/rewind":
            if not arg or arg == "0":
                if not agent.turns:
                    return CommandResult("no turns to rewind")
                lines = []
                for k, t in enumerate(reversed(agent.turns), start=1):
                    msg = agent.messages[t["n_messages"]] if t["n_messages"] < len(agent.messages) else {}
                    latest = " (the latest)" if k == 1 else ""
                    lines.append(f"{k}: turn {t['turn']}{latest}: {str(msg.get('content', ''))[:70]!r}")
                return CommandResult("/rewind N undoes the last N turns, N from this list:\n" + "\n".join(lines))
            n = int(arg)
            nums = [t["turn"] for t in agent.turns[-n:]] if 0 < n <= len(agent.turns) else []
            rec = agent.rewind(n)
            turns = f"turn {nums[0]}" if n == 1 else "turns " + ", ".join(map(str, nums))
            return CommandResult(f"undid the last {n} turn{'s' if n > 1 else ''} ({turns}): code and conversation "
                                 f"restored to before turn {rec['to_turn']}" + _saved(rec))  # fmt: skip
        if name == "/diff":
            d = session_diff(agent)
            return CommandResult(d, diff=True) if d else CommandResult("this session has changed nothing")
        if name == "/compact":
            ok = agent.compact(focus=arg or None, reason="user")
            return CommandResult("compacted" if ok else "compaction was blocked by a hook", error=not ok)
        if name == "/model":
            if not arg:
                return CommandResult(f"model: {agent.model.config.model} at {agent.model.config.base_url}")
            agent.model.config = dataclasses.replace(agent.model.config, model=arg)
            agent.writer.write("model_switch", model=arg)
            return CommandResult(f"model is now {arg}")
        if name == "/mode":
            if not arg:
                return CommandResult(f"mode: {agent.permissions.mode} (one of {', '.join(MODES)})")
            if arg not in MODES:
                return CommandResult(f"unknown mode {arg!r}; one of {', '.join(MODES)}", error=True)
            agent.permissions.mode = arg
            return CommandResult(f"mode is now {arg}")
        if name == "/cost":
            return CommandResult(cost_line(agent))
        if name == "/sessions":
            rows = [f"{s.id}  {s.title!r}" for s in list_sessions(session.path.parent)[:10]]
            return CommandResult("\n".join(rows) or "no sessions")
    except (ValueError, RuntimeError) as e:
        return CommandResult(str(e), error=True)
    return CommandResult(f"unknown command {name}; /help lists them", error=True)


def session_diff(agent: Any) -> str:
    """The unified diff from the working tree at the session's first turn to the working tree now (untracked
    files included: both ends are checkpoints)."""
    if not (agent.checkpoints and agent.checkpoints.enabled):
        raise RuntimeError("no checkpoints here (not a git repository): the session's changes are unknown")
    first = agent.first_checkpoint()
    now = agent.checkpoints.snapshot("diff")
    if first is None or now is None:
        return ""
    r = git(agent.env.root, "diff", "--no-color", "--no-ext-diff", "--no-textconv", first, now.commit, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"git diff failed: {r.stderr.strip()[:300]}")
    return r.stdout


def _saved(rec: dict[str, Any]) -> str:
    if not rec.get("saved_as"):
        return ""
    c = rec["saved_as"]
    return f"\nthe files as they were before are kept in commit {c[:12]} (git checkout {c[:12]} -- <path> recovers one)"


def cost_line(agent: Any) -> str:
    s = agent.stats
    window = agent.config.context_window
    used = 100 * s.last_prompt_tokens / window if window else 0
    return (
        f"{s.prompt_tokens:,} prompt + {s.completion_tokens:,} completion tokens, ${s.cost_usd:.4f}, "
        f"{s.steps} model calls, context {used:.0f}% of {window:,}"
    )


def run_shell(agent: Any, command: str) -> str:
    """`!cmd`: the user's own command. Its output is added to the conversation for the model to see."""
    res = agent.env.execute(command)
    text = f"{res.output.rstrip()}\n[exit code {res.returncode}]"
    agent.add_message({"role": "user", "content": f"I ran `{command}` myself. Output:\n```\n{text}\n```"})
    return text


def expand_mentions(agent: Any, text: str) -> str:
    """Attach the files named with @path (inside the allowed folders) to the task."""
    blocks = []
    for m in _MENTION.finditer(text):
        path = agent.env.resolve(m.group(1).rstrip(".,;:"))
        if not path.is_file() or not agent.env.is_allowed(path):
            continue
        data = path.read_bytes()[:MAX_MENTION_BYTES]
        if b"\0" in data[:8192]:
            continue
        agent.state.read_files[str(path)] = path.stat().st_mtime_ns
        blocks.append(f'<file path="{agent.env.display(path)}">\n{data.decode("utf-8", errors="replace")}\n</file>')
    return text if not blocks else text + "\n\n" + "\n\n".join(blocks)
