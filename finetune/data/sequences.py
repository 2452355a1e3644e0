"""Sessions -> training sequences: one sequence per branch of a session, every model turn in it a target.

Every reader (glm5 trajectories, OpenAI chat JSONL, mini-swe-agent, Harbor) turns its file into `Session`s:
the tools and the model calls in order, each call the prompt messages it was sent and the response it got
(with the token ids it recorded, if any). Here a session becomes sequences:

- Branches. A call whose prompt extends the previous call's prompt + response continues the branch; one that
  does not (a compaction, a rewind, a sub-agent) starts a new one. Each branch is one sequence: the last
  call's conversation, with every earlier response in it trained too (a session of N calls costs O(N) tokens,
  not O(N^2) as one sample per call would).
- Masks from our chat format (model/chat.py): a model turn's generated tokens are 1 (reasoning, content, tool
  calls, and the role token that closed the turn, as GLM-5 trains it); role tags, `<think>`, system, user and
  tool text are 0. Reasoning is kept on every turn (clear_thinking=False: GLM-5's preserved thinking in coding
  agents), so each trained turn has the reasoning the model wrote.
- Token in, token out (TITO). When every call of a branch recorded its prompt and completion token ids and each
  prompt extends the previous prompt + completion token for token, the sequence is those ids, exactly what
  was sampled: nothing is re-tokenized. Otherwise the branch is rendered from its messages.
- A response cut at max_tokens (finish_reason "length") gets no end-of-turn token: the model never chose to
  stop there, so the token that follows it (the next role tag, or the closing <|endoftext|>) is not a target.
- A call marked `trained=False` (a tool call the user denied, a format error: the readers decide) stays in the
  sequence as context but is not a target, as GLM-5 masks erroneous segments in agent data.

Knows the chat format, nothing of models or training. Shapes: ids and mask are lists of one length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.chat import END_OF_TEXT, Segment, render_segments
from model.special_tokens import EOS_TOKENS


@dataclass
class Call:
    """One model call: the prompt messages, the response message, how it ended, and its recorded ids."""

    messages: list[dict]
    response: dict
    where: str  # "FILE:LINE" of the record, for reports
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    trained: bool = True


@dataclass
class Session:
    calls: list[Call]
    tools: list[dict] = field(default_factory=list)
    source: str = ""


@dataclass
class TrainSequence:
    ids: list[int]
    mask: list[bool]  # True: a target (a token the model generated)
    source: str
    tito: bool = False  # the recorded token ids, not a rendering

    @property
    def targets(self) -> int:
        return sum(self.mask)


def branches(session: Session) -> list[list[Call]]:
    """Split the calls where a prompt does not extend the previous prompt + response (message by message)."""
    out: list[list[Call]] = []
    convo: list[dict] | None = None
    for call in session.calls:
        if convo is None or call.messages[: len(convo)] != convo:
            out.append([])
        out[-1].append(call)
        convo = [*call.messages, call.response]
    return out


def sequence_of(branch: list[Call], tools: list[dict], tokenizer, source: str) -> TrainSequence:
    """A branch -> its sequence: recorded ids where every call has them and they chain, else rendered."""
    tito = _tito(branch, tokenizer)
    if tito is not None:
        return TrainSequence(*tito, source=source, tito=True)
    return TrainSequence(*render_branch(branch, tools, tokenizer), source=source)


def render_branch(branch: list[Call], tools: list[dict], tokenizer) -> tuple[list[int], list[bool]]:
    """The last call's conversation rendered; the segments the model generated in the trained calls are 1."""
    last = branch[-1]
    msgs = [*last.messages, last.response]
    position = {len(c.messages): c for c in branch}  # each response's index in the final conversation
    segs = render_segments(msgs, tools or None, add_generation_prompt=False, clear_thinking=False)
    final = position[len(msgs) - 1]
    if final.trained and final.finish_reason != "length":
        segs.append(Segment(END_OF_TEXT, len(msgs) - 1, True))  # the closing token of the last turn
    ids: list[int] = []
    mask: list[bool] = []
    for seg, seg_ids in zip(segs, tokenizer.encode_batch([s.text for s in segs]), strict=True):
        call = position.get(seg.message_index)
        target = seg.generated and call is not None and call.trained
        if target and call.finish_reason == "length" and seg.text in (*EOS_TOKENS, END_OF_TEXT):
            target = False  # the tag after a truncated turn: the model did not end it
        ids += seg_ids
        mask += [target] * len(seg_ids)
    return ids, mask


def _tito(branch: list[Call], tokenizer) -> tuple[list[int], list[bool]] | None:
    """The recorded ids chained call after call, or None if some call lacks them or a prompt drifted."""
    if any(c.prompt_ids is None or c.completion_ids is None for c in branch):
        return None
    eos = {tokenizer.special_id(t) for t in EOS_TOKENS}
    ids: list[int] = []
    mask: list[bool] = []
    open_turn = False  # the previous completion ended without its stop token: the next prompt token is it
    for call in branch:
        p = list(call.prompt_ids)
        if p[: len(ids)] != ids:
            return None  # drift: the prompt re-tokenized the history differently (render instead)
        new = p[len(ids) :]
        close = open_turn and bool(new) and new[0] in eos
        mask += [close] + [False] * (len(new) - 1) if close else [False] * len(new)
        ids += new
        c = list(call.completion_ids)
        ids += c
        mask += [call.trained] * len(c)
        open_turn = call.trained and call.finish_reason != "length" and not (c and c[-1] in eos)
    if open_turn:  # the last turn ended by the model: close it as render_for_training does
        ids.append(tokenizer.special_id(END_OF_TEXT))
        mask.append(True)
    return ids, mask
