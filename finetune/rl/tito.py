"""Token in, token out: the token record of one agent session, built from what the rollout engine sampled.

The agent speaks messages; the engine speaks token ids. A call's prompt is never re-tokenized from the
conversation's text: when the new messages extend the previous call's (its messages plus the assistant
message that call produced), the prompt is the previous prompt + the sampled ids + the new messages' tokens
appended by our chat format (model/chat.py, segment by segment, so the ids are the template's). The trainer
then trains exactly the sampled ids with their logprobs; prompts and tool output are masked out.

GLM-5's template is not append-only: it drops the reasoning of every assistant turn before the last user
message, so after a new user message the template's prompt no longer starts with the tokens sampled before.
Our choice (slime's TrajectoryManager does the same): follow the template, and start a new *branch* where
the prefix diverges. The new branch's prompt is the template's rendering of the messages (what `glm5 serve`
would have given the model); the old branch stays a training sample with the tokens it had. Each branch is
one `TokenSample` and gets the session's reward. Within an agent session (one task message, then tool
turns) the template keeps all reasoning, so a session is one branch unless the agent nudges the model with a
user message, compacts, or changes its tools. With `keep_reasoning=True` nothing is re-rendered (append-only,
the model sees its old reasoning): one branch per session unless the agent rewrites its history.

The model's stop token is kept as sampled. Where the template closes the turn with another role tag (the
model stopped on `<|user|>` where a tool result follows, or was cut at max_tokens), that tag follows as
prompt (mask 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from finetune.rl.rollout import ModelCall, TokenSample
from model.chat import ROLE_TAGS, render_segments


@dataclass
class Branch:
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    messages: list[dict]  # the conversation `ids` holds, the last assistant message included
    tools: Any
    versions: list[int] = field(default_factory=list)


def _canon(m: dict) -> str:
    """A message as compared for prefix reuse: what the template reads of it."""
    keep = {k: m.get(k) for k in ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")}
    keep["content"] = keep["content"] or ""
    return json.dumps(keep, sort_keys=True, ensure_ascii=False)


class TitoSession:
    """The branches of one session. `prompt(messages, tools)` -> (branch, prompt ids) for the next call;
    `record(...)` appends what the engine sampled; `samples()` -> one TokenSample per branch."""

    def __init__(self, tokenizer, keep_reasoning: bool = False, thinking: bool = True):
        self.tok = tokenizer
        self.keep_reasoning = keep_reasoning
        self.thinking = thinking  # the generation prompt's `<think>` (on) or `</think>` (off)
        self.branches: list[Branch] = []
        self.calls: list[ModelCall] = []
        self.eos = set(tokenizer.eos_token_ids)

    def _encode(self, segs) -> list[int]:
        return [t for ids in self.tok.encode_batch([s.text for s in segs]) for t in ids]

    def _extends(self, b: Branch, messages: list[dict], tools: Any) -> bool:
        n = len(b.messages)
        if tools != b.tools or len(messages) <= n:
            return False
        if [_canon(m) for m in messages[:n]] != [_canon(m) for m in b.messages]:
            return False
        suffix = messages[n:]
        if any(m.get("role") in ("assistant", "system") for m in suffix):
            return False  # a turn the engine did not sample, or a new system prompt: not an extension
        if not self.keep_reasoning and any(m.get("role") == "user" for m in suffix):
            # The template would now drop the reasoning of the turns before this user message.
            return not any(m.get("role") == "assistant" and m.get("reasoning_content") for m in b.messages)
        return True

    def prompt(self, messages: list[dict], tools: Any = None) -> tuple[int, list[int]]:
        self._mark_refused(messages)
        clear = not self.keep_reasoning
        if self.branches and self._extends(self.branches[-1], messages, tools):
            b = self.branches[-1]
            n = len(b.messages)
            segs = render_segments(messages, tools, add_generation_prompt=True, enable_thinking=self.thinking,
                                   clear_thinking=clear)  # fmt: skip
            k = next(i for i, s in enumerate(segs) if s.message_index >= n)
            closing = segs[k - 1] if segs[k - 1].message_index == n - 1 and segs[k - 1].generated else None
            head: list[int] = []
            if closing is not None and closing.text in ROLE_TAGS.values():
                tag = self.tok.encode(closing.text)
                if not (b.mask and b.mask[-1] and b.ids[-len(tag) :] == tag):
                    head = tag  # the engine stopped on another token (or none): the template's tag as prompt
            new = head + self._encode(segs[k:])
            b.ids += new
            b.mask += [0] * len(new)
            b.logprobs += [0.0] * len(new)
            b.messages = list(messages)
            return len(self.branches) - 1, list(b.ids)
        ids = self._encode(render_segments(messages, tools, add_generation_prompt=True,
                                           enable_thinking=self.thinking, clear_thinking=clear))  # fmt: skip
        self.branches.append(Branch(ids, [0] * len(ids), [0.0] * len(ids), list(messages), tools))
        return len(self.branches) - 1, list(ids)

    def raw(self, ids: list[int]) -> int:
        """A branch of prompt ids given as they are (no messages: nothing extends it) -> its index."""
        self.branches.append(Branch(list(ids), [0] * len(ids), [0.0] * len(ids), [], None))
        return len(self.branches) - 1

    def record(
        self,
        branch: int,
        prompt_ids: list[int],
        output_ids: list[int],
        logprobs: list[float],
        version_start: int,
        version_end: int,
        finish_reason: str | None,
        assistant_message: dict,
    ) -> ModelCall:
        if len(output_ids) != len(logprobs):
            raise ValueError(f"the rollout server returned {len(logprobs)} logprobs for {len(output_ids)} tokens")
        b = self.branches[branch]
        if b.ids != prompt_ids:
            raise ValueError("record: the prompt is not the branch's tokens (a call was recorded out of order)")
        call = ModelCall(
            list(prompt_ids), list(output_ids), list(logprobs), version_start, version_end, finish_reason,
            branch, len(b.ids),
        )  # fmt: skip
        b.ids += output_ids
        b.mask += [1] * len(output_ids)
        b.logprobs += [float(x) for x in logprobs]
        b.versions.append(version_start)
        b.messages.append(assistant_message)
        self.calls.append(call)
        return call

    def _mark_refused(self, messages: list[dict]) -> None:
        """The tool results that follow the last call's assistant message are its answers: when a tool refused a
        call (the agent loop's `error: ...`: an edit whose old_string is not in the file, a missing path, bad
        arguments; a command's nonzero exit is not one), that call wasted its turn."""
        if not self.calls:
            return
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is None:
            return
        for m in messages[last + 1 :]:
            if m.get("role") == "tool" and str(m.get("content") or "").startswith("error:"):
                self.calls[-1].refused = True

    def samples(self) -> list[TokenSample]:
        """One sample per branch that holds sampled tokens; the template text after its last call is left out."""
        out = []
        for k, b in enumerate(self.branches):
            if not any(b.mask):
                continue
            end = max(i for i, m in enumerate(b.mask) if m) + 1
            refused = [[c.offset, c.offset + len(c.output_ids)] for c in self.calls if c.branch == k and c.refused]
            out.append(TokenSample(b.ids[:end], b.mask[:end], b.logprobs[:end], min(b.versions), refused))
        return out
