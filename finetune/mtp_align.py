"""Align the MTP layer with its own main model: generate with the model, then train the MTP layer alone on that.

A draft is accepted when it is what the main model would have said, so the MTP layer's best training data is
the main model's own output, and its best target the main model's distribution (self-distillation; Medusa-2 and
EAGLE train their draft heads this way). GLM-5's MTP loss trains on text instead: on text the main model is
often wrong, and every such position teaches the drafts to disagree with it. After a fine-tune changes the main
model the mismatch grows. Aligning fixes it without touching the main model, so outputs stay exactly the same;
only acceptance, and with it the speed of speculative decoding, changes.

    seqs = generate_sequences(model, prompts, max_new_tokens=96)      # the engine, greedy, batched
    align_mtp(model, seqs)                                           # MTP layer only; main model untouched

Agent trajectories that glm5 recorded from the served model are already the model's own output: they can be
passed as `seqs` directly (with their prompt lengths, so only the model's tokens are targets).

Shapes: B batch, T tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from finetune.data.batches import padded_batches
from finetune.mtp_objective import MTPTrainConfig, train_mtp
from finetune.train_loop import LossTerms, OptimConfig
from serve.engine import EngineConfig, LLMEngine, SamplingParams


def generate_sequences(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    max_num_seqs: int = 32,
    ignore_eos: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[list[int], int]]:
    """Greedy continuations from the embedded engine -> [(prompt + continuation, prompt length)], prompt order.

    Greedy, because that is what the drafts are judged against at temperature 0 (and the mode of the sampled
    distribution otherwise). `progress(done, total)` is called as requests finish.
    """
    if not prompts:
        raise ValueError("no prompts to generate from")
    if any(not p for p in prompts):
        raise ValueError(f"prompt {next(i for i, p in enumerate(prompts) if not p)} is empty")
    engine = LLMEngine(model, config=EngineConfig(max_num_seqs=max_num_seqs))
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=ignore_eos)
    ids = [engine.add_request(p, params) for p in prompts]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished:
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o.token_ids
                if progress:
                    progress(len(done), len(prompts))
    return [(list(p) + done[i], len(p)) for p, i in zip(prompts, ids, strict=True)]


def default_draft_vocab_size(seqs: list[tuple[list[int], int]], vocab_size: int) -> int:
    """V/16 (the fastest share in benchmarks/bench_mtp.py, acceptance unchanged there), or more when the model's
    generations in `seqs` need more distinct tokens than that to make up 99.9% of what it said."""
    return min(vocab_size, max(vocab_size // 16, len(draft_vocab(seqs, coverage=0.999))))


def draft_vocab(
    seqs: list[tuple[list[int], int]],
    size: int | None = None,
    coverage: float = 0.99,
    fallback: Iterable[int] = (),
) -> list[int]:
    """A draft vocabulary for `EngineConfig.draft_vocab` (sorted token ids), ranked by how often the model
    generated each token in `seqs`: the model's own output is the right sample, since drafts only ever need
    to propose what it says. `size` None: the fewest top tokens that make up `coverage` of the generated
    tokens. With a `size`, the top `size`; if the model generated fewer distinct tokens, the rest are the most
    frequent of `fallback` (a token stream, e.g. the training text)."""
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    if size is not None and size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    counts = Counter(t for s, p in seqs for t in s[p:])
    if not counts:
        raise ValueError("the sequences have no generated tokens to count")
    ranked = [t for t, _ in counts.most_common()]
    if size is None:
        total, n = sum(counts.values()), 0
        for i, t in enumerate(ranked):
            n += counts[t]
            if n >= coverage * total:
                return sorted(ranked[: i + 1])
        return sorted(ranked)
    seen = set(ranked)
    ranked += [t for t, _ in Counter(fallback).most_common() if t not in seen]
    return sorted(ranked[:size])


def align_mtp(
    model,
    seqs: list[tuple[list[int], int]],
    cfg: MTPTrainConfig = MTPTrainConfig(OptimConfig(steps=300, lr=3e-3, warmup=10), train_main=False),
    batch_size: int = 8,
    seed: int = 0,
    log_every: int = 0,
    log=print,
    **checkpointing,
) -> list[LossTerms]:
    """Train the MTP layer alone on (sequence, prompt length) pairs; only generated tokens are targets.
    `checkpointing`: train_mtp's resume / save / save_every (the batch order is fixed by `seed`, so a resumed
    run continues the interrupted one exactly).
    `cfg.train_main` is forced off: aligning never changes what the main model outputs.

    `cfg.targets`: "tokens" (default) trains on the generated tokens themselves, which for greedy generations
    are the main model's argmax, exactly what greedy acceptance tests; "model" trains towards the main
    model's whole distribution (KL), for speculation under sampling. On the benchmark's trained `tiny`,
    "tokens" raised acceptance at k = 3 from 2.76 to 3.22, "model" to 2.99 (benchmarks/RESULTS.md)."""
    cfg = replace(cfg, train_main=False)
    batches = padded_batches(seqs, batch_size, cfg.num_mtp_steps + 2, seed)
    return train_mtp(model, batches, cfg, log_every=log_every, log=log, **checkpointing)
