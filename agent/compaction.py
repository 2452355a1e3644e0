"""Compaction: the conversation summarized by the model and restarted from the summary.

    compact(agent, focus, reason)
      PreCompact hook (may block) -> the model summarizes (the oldest half dropped until the request fits)
      -> context.compacted(system prompt re-read from disk, summary, the last request when automatic; the screen
         of each terminal session still open)
      -> `compaction` record -> the agent's messages replaced; earlier turns can no longer be rewound

The loop calls it near the context limit and after a context-length error; /compact calls it with a focus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent import context
from agent.client import ContextLengthError

if TYPE_CHECKING:
    from agent.loop import Agent


def compact(agent: Agent, focus: str | None = None, reason: str = "user") -> bool:
    """Summarize the conversation and restart it from the summary, instruction files re-read. False if blocked."""
    if agent.hooks:
        h = agent.hooks.run("PreCompact", {"trigger": "manual" if reason == "user" else "auto", "focus": focus})
        agent.warn(h.warnings)
        if h.blocked:
            agent.ui.on_notice(f"compaction blocked by hook: {h.message}")
            return False
    msgs = agent.messages
    # The conversation may itself be too long to summarize: drop the oldest half of it until it fits.
    keep = list(msgs[1:])
    while True:
        try:
            resp = agent.model.query(context.summary_request(msgs[:1] + keep, focus), None)
            break
        except ContextLengthError:
            if len(keep) <= 2:
                raise
            keep = context.drop_oldest_half(keep)
    summary = resp.content or ""
    last_user = None
    if reason != "user":
        users = [m for m in msgs if m.get("role") == "user" and isinstance(m.get("content"), str)]
        last_user = users[-1]["content"] if users else None
    new = context.compacted(agent.system_prompt(), summary, last_user)
    terms = getattr(agent.env, "_terminals", None)
    if terms is not None and (screens := terms.live_screens()):
        new[1] = {**new[1], "content": new[1]["content"] + "\n\n" + screens}  # a live session's latest screen
    u = resp.usage or {}
    agent.stats.prompt_tokens += u.get("prompt_tokens") or 0
    agent.stats.completion_tokens += u.get("completion_tokens") or 0
    agent.stats.last_prompt_tokens = 0
    agent.writer.write("compaction", reason=reason, summary=summary, messages=new, n_before=len(msgs),
                       response=resp.raw)  # fmt: skip
    agent.messages = list(new)
    # turns before the compaction can no longer be rewound to message-wise; keep their code checkpoints only
    agent.turns = []
    agent.ui.on_notice(f"compacted {len(msgs)} messages into a summary ({reason})")
    return True
