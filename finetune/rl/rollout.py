"""What a rollout is: the model calls of one agent session (token ids in and out, the rollout engine's logprobs,
the weight version of each call), its grade, and the token samples the trainer trains on.

A session is split into branches (see tito.py): a branch is one token sequence that every call of it extended,
so its sampled tokens can be trained in one forward pass with the prompt exactly as the engine saw it. Each
branch becomes one `TokenSample`: ids, a loss mask (1 on the tokens the engine sampled, 0 on prompts and tool
output) and the rollout logprob of every masked token. Everything here is plain data that round-trips through
JSON: the buffer writes finished rollouts to disk and a resumed run reads them back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Rollout statuses: graded; the environment failed (not the model's fault: the crash-group rule); or the session ran
# but its reward's checker could not run (a completion env's: left out of its group's advantages, the group kept)
OK, ENV_ERROR, UNSCORED = "ok", "env_error", "unscored"


@dataclass
class ModelCall:
    """One request to the rollout server: the prompt ids it was given, the ids it sampled with their logprobs,
    and the weight versions at its first and last token (a push between them makes a call span two)."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    version_start: int
    version_end: int
    finish_reason: str | None = None
    branch: int = 0  # which branch of the session this call extended
    offset: int = 0  # where its output starts in that branch's ids
    refused: bool = False  # a tool refused a call it made (answered `error: ...`): the turn was wasted


@dataclass
class TokenSample:
    """One branch, as trained: `mask[t]` is 1 where `ids[t]` was sampled, and then `logprobs[t]` is its rollout
    logprob (0.0 elsewhere). `version` is the oldest weight version among the calls it holds; `refused` the
    spans of the calls whose tool calls a tool refused (`--refusal-penalty` pushes them down)."""

    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    version: int
    refused: list[list[int]] = field(default_factory=list)  # [start, end) of each refused call's sampled ids

    @property
    def n_sampled(self) -> int:
        return sum(self.mask)


@dataclass
class Rollout:
    """One session of a group: task `task` (its index in the task list), sample `index` of group `group`."""

    group: int
    index: int
    task: int
    status: str = OK
    reward: float | None = None
    solved: bool | None = None
    error: str = ""
    calls: list[ModelCall] = field(default_factory=list)
    samples: list[TokenSample] = field(default_factory=list)
    seconds: float = 0.0
    detail: dict = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.status == OK and self.reward is not None

    @property
    def in_group(self) -> bool:
        """Whether it stays in its group: graded, or unscored (no advantage, not a crash)."""
        return self.valid or self.status == UNSCORED

    @property
    def oldest_version(self) -> int | None:
        return min((c.version_start for c in self.calls), default=None)

    @property
    def sampled_tokens(self) -> int:
        return sum(len(c.output_ids) for c in self.calls)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Rollout:
        d = dict(d)
        d["calls"] = [ModelCall(**c) for c in d.get("calls", [])]
        d["samples"] = [TokenSample(**s) for s in d.get("samples", [])]
        return cls(**d)


@dataclass(frozen=True)
class Grade:
    """An environment's verdict on a session: the reward (None: the grader could not run), solved (None:
    unknown), and `status` ENV_ERROR when the environment itself failed, or UNSCORED when only the reward's
    checker did, with why."""

    reward: float | None
    solved: bool | None = None
    status: str = OK
    error: str = ""
    detail: dict = field(default_factory=dict)
