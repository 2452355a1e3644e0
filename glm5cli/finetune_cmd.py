"""`glm5 finetune`: SFT and RL on recorded trajectories."""

from __future__ import annotations

from glm5cli.common import not_built


def finetune() -> None:
    """Fine-tune on trajectories."""
    not_built("finetune")
