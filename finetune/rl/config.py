"""The run configuration of RL (agentic, or on completions): one frozen dataclass, each field a flag of
`glm5 finetune rl`.

Defaults are GLM-5's where the report gives them (finetuning-rl.md §1.2-1.3): the kept importance-ratio band
[1 - 0.2, 1 + 0.28] (the report's eps_low / eps_high; for the direct double-sided IS of §4.1.2 it names no
other values), IcePop's beta = 2 for on-policy runs, crash groups padded when more than half is valid, and an
optimizer reset at each weight push off unless asked for (the report resets; with one update per push and
LoRA at our scale a reset throws Adam's moments away every step, so it is a flag). The report gives no value
for the staleness bound tau; 2 versions (between TRL's 4 and SkyRL/AReaL's "0 = sync") is ours. The completion
recipe (finetune/grpo.py, `--env completion`) runs on the same config, synchronously (IcePop), with the LR warm-up
and several updates per batch under PPO's clip as options (once finetune/grpo.py's own GRPOConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

OBJECTIVES = ("auto", "icepop", "double-is")
LOSS_AGGS = ("sample", "token")


@dataclass(frozen=True)
class RLConfig:
    steps: int = 50
    groups_per_step: int = 2  # tasks per optimizer step
    group_size: int = 8  # sessions per task (GRPO's group)
    max_new_tokens: int = 256  # per model call
    max_turns: int = 8  # model calls per session
    temperature: float = 1.0
    lr: float = 2e-5
    warmup: int = 0  # steps of linear LR warm-up (step k trains at lr * min(1, k / warmup)); 0: none
    max_grad_norm: float = 1.0
    # Optimizer steps per batch of groups: past the first, the ratio is to the first's logprobs (pi_train_old) and
    # PPO's clip [1 - is_low, 1 + is_high] applies (the report's eps_low / eps_high); the band then masks on
    # pi_train_old / pi_rollout. One step of the run (one weight version) either way.
    updates_per_batch: int = 1
    objective: str = "auto"  # auto: icepop with --sync, double-is otherwise
    is_low: float = 0.2  # double-sided IS keeps r = pi_theta / pi_rollout inside [1 - is_low, 1 + is_high]
    is_high: float = 0.28
    icepop_beta: float = 2.0  # IcePop keeps [1 / beta, beta]
    max_staleness: int = 2  # tau: drop a sample whose oldest call lags the trainer by more than tau versions
    reset_optimizer: bool = False  # reset AdamW's state at each weight push (GLM-5 §3.3)
    sync: bool = False  # the synchronous baseline: roll out, then train, then push, on the same roles
    concurrency: int = 8  # sessions at once
    keep_reasoning: bool = False  # True: never re-render a turn; False: branch where the template rewrites one
    # GLM-5 thinks by default (the generation prompt opens `<think>`); False renders `</think>` instead, as
    # `chat_template_kwargs.enable_thinking=false` does in `glm5 serve`: for a policy trained without reasoning
    thinking: bool = True
    partial_credit: bool = False
    # DAPO's dynamic sampling: a group whose sessions all got the same reward has no GRPO advantage; drop it
    # and run another task in its place, up to dynamic_sampling x groups_per_step such groups a step (0: off)
    dynamic_sampling: int = 0
    # How a step's token terms are averaged. sample: each sample's own mean, then over the step's sessions
    # (GRPO's 1/G sum_i 1/|y_i| sum_t, the report's IcePop formula): a long sample's tokens weigh less each, so a
    # long wrong session is pushed down less per token than a short one. token: one mean over every trained
    # token of the step (DAPO's token-level loss, TRL's default `loss_type="dapo"`): each token weighs the same.
    loss_agg: str = "sample"
    # A turn-level penalty on top of the session's outcome: the sampled tokens of a call a tool refused (the agent
    # loop answered `error: ...`) are trained with advantage min(A, 0) - refusal_penalty instead of A, so a step
    # pushes down exactly the calls that wasted a turn, even in a session that solved its task (a session's group
    # advantage cannot tell them from the rest of it). 0: off, the outcome alone.
    refusal_penalty: float = 0.0
    # The weight of the sessions that did worse than their group (negative advantages): 1 is GRPO; below 1 pushes
    # down failures less than it pulls up successes (0: only successes are reinforced, rejection-sampling
    # fine-tuning on the policy's own sessions: PSR / RAFT, which trades pass@k for pass@1).
    negative_weight: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: GRPO's advantage compares sessions of one task")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0: RL samples (greedy rollouts have no spread to learn from)")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {self.objective!r}")
        if self.loss_agg not in LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGGS)}, not {self.loss_agg!r}")
        if not 0 <= self.is_low < 1 or self.is_high <= 0:
            raise ValueError("is_low must be in [0, 1) and is_high > 0 (the kept band is [1 - is_low, 1 + is_high])")
        if self.icepop_beta <= 1:
            raise ValueError("icepop_beta must be > 1 (the kept band is [1/beta, beta])")
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0 (0: every sample comes from the trainer's weights)")
        if not 0 <= self.negative_weight <= 1:
            raise ValueError("negative_weight must be in [0, 1] (1: GRPO; 0: only successes are reinforced)")
        if self.refusal_penalty < 0:
            raise ValueError("refusal_penalty must be >= 0 (0: off)")
        if self.dynamic_sampling < 0:
            raise ValueError("dynamic_sampling must be >= 0 (0: off; K: drop up to K x groups_per_step "
                             "no-signal groups a step)")  # fmt: skip
        if self.warmup < 0:
            raise ValueError("warmup must be >= 0 (0: no warm-up)")
        for name in ("steps", "groups_per_step", "max_new_tokens", "max_turns", "concurrency", "updates_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def band(self) -> tuple[float, float]:
        """The kept interval of the importance ratio r = pi_theta / pi_rollout."""
        objective = self.objective if self.objective != "auto" else ("icepop" if self.sync else "double-is")
        if objective == "icepop":
            return 1.0 / self.icepop_beta, self.icepop_beta
        return 1.0 - self.is_low, 1.0 + self.is_high

    @property
    def clip(self) -> tuple[float, float]:
        """PPO's clip of pi_theta / pi_train_old, for the updates after the first on one batch."""
        return 1.0 - self.is_low, 1.0 + self.is_high

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based): linear warm-up, then constant."""
        return self.lr * min(1.0, (step + 1) / self.warmup) if self.warmup else self.lr

    @property
    def staleness(self) -> int:
        """The bound the orchestrator's admission gate and the buffer enforce: 0 in a synchronous run."""
        return 0 if self.sync else self.max_staleness
