"""Benchmark prompts: `random` and `shared-prefix` (sglang's `random` and `generated-shared-prefix`).

Prompts are made of words drawn from a fixed vocabulary, one word per requested token: the client has no
tokenizer of the server's model, so lengths are approximate on the way in and the server's own `usage` counts are
what the metrics use on the way out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Short, common English words: most tokenizers give each one a single token (with its leading space).
WORDS = (
    "the of and to in is was for on are with as at be this have from or one had by word but not what all were we "
    "when your can said there use an each which she do how their if will up other about out many then them these so "
    "some her would make like him into time has look two more write go see number no way could people my than first "
    "water been call who oil its now find long down day did get come made may part over new sound take only little "
    "work know place year live me back give most very after thing our just name good sentence man think say great "
    "where help through much before line right too mean old any same tell boy follow came want show also around form"
).split()


@dataclass(frozen=True)
class BenchRequest:
    """One request to send: the prompt text, its approximate length in tokens, and how many tokens to ask for."""

    prompt: str
    prompt_len: int
    output_len: int
    system: str | None = None  # a shared system prompt (shared-prefix dataset); chat requests send it as a message


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(n, 1)))


def _length(rng: random.Random, target: int, range_ratio: float) -> int:
    """A length in [target * range_ratio, target] (sglang's --random-range-ratio; 1.0 = always `target`)."""
    return max(1, rng.randint(max(1, int(target * range_ratio)), target))


def random_dataset(
    num_prompts: int, input_len: int = 256, output_len: int = 64, range_ratio: float = 1.0, seed: int = 0
) -> list[BenchRequest]:
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        n_in = _length(rng, input_len, range_ratio)
        out.append(BenchRequest(_words(rng, n_in), n_in, _length(rng, output_len, range_ratio)))
    return out


def shared_prefix_dataset(
    num_groups: int = 4,
    prompts_per_group: int = 8,
    system_prompt_len: int = 512,
    question_len: int = 64,
    output_len: int = 64,
    seed: int = 0,
) -> list[BenchRequest]:
    """`num_groups` system prompts, each followed by `prompts_per_group` distinct questions, shuffled together."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_groups):
        system = _words(rng, system_prompt_len)
        for _ in range(prompts_per_group):
            question = _words(rng, question_len)
            out.append(BenchRequest(question, system_prompt_len + question_len, output_len, system=system))
    rng.shuffle(out)
    return out
