"""Rewind: the last N user turns undone, code and conversation (what /undo and /rewind N do).

Each turn remembers the conversation's length and the working tree's checkpoint at its start; rewinding restores
that checkpoint (snapshotting the present first, so the rewind is itself recoverable), cuts the conversation
back and writes a `rewind` record, which `Trajectory.messages()` replays on resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.loop import Agent


def rewind(agent: Agent, n: int = 1) -> dict[str, Any]:
    """Undo the last `n` user turns: the working tree and the conversation go back to before them."""
    if n < 1 or n > len(agent.turns):
        raise ValueError(f"can rewind 1..{len(agent.turns)} turns, not {n}")
    target = agent.turns[-n]
    saved = None
    if agent.checkpoints and target.get("checkpoint"):
        saved = agent.checkpoints.restore(target["checkpoint"])
    del agent.messages[target["n_messages"] :]
    del agent.turns[-n:]
    agent.undone_turns += n
    agent.state.read_files.clear()  # files may differ from what the model read
    rec = {
        "to_turn": target["turn"],
        "n_turns": n,
        "n_messages": target["n_messages"],
        "checkpoint": target.get("checkpoint"),
        "saved_as": saved.commit if saved else None,
    }
    agent.writer.write("rewind", **rec)
    return rec
