"""Batches for the training loop: random windows of a token stream, and shuffled padded batches of
(sequence, target mask) pairs. Deterministic for a seed, so a resumed run sees the batches it would have seen.

Shapes: B batch, T tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def token_batches(
    tokens: list[int] | torch.Tensor, seq_len: int, batch_size: int, seed: int = 0
) -> Iterator[torch.Tensor]:
    """Endless random windows [batch_size, seq_len] from one long token stream (a tokenised corpus)."""
    data = torch.as_tensor(tokens, dtype=torch.long)
    if data.numel() <= seq_len:
        raise ValueError(f"the corpus has {data.numel()} tokens; need more than seq_len={seq_len}")
    gen = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=gen)
        yield torch.stack([data[s : s + seq_len] for s in starts.tolist()])


def padded_batches(
    seqs: list[tuple[list[int], int | list[bool]]], batch_size: int, min_len: int, seed: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled batches (ids [B, T], target mask [B, T]): whole sequences, right-padded with token 0 to
    the batch's longest. Each sequence comes with its targets: a prompt length (the tokens from there on are
    targets: what the model generated) or a mask of its own length. Padding sits after every real token, so it
    changes nothing a causal model computes for them."""
    usable = [(s, _mask(s, p)) for s, p in seqs if len(s) >= min_len]
    usable = [(s, m) for s, m in usable if any(m)]
    if not usable:
        raise ValueError(f"no sequence has {min_len} tokens and a generated part; generate longer continuations")
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(usable), generator=gen).tolist()
        for start in range(0, max(1, len(usable) - batch_size + 1), batch_size):
            chosen = [usable[i] for i in order[start : start + batch_size]]
            T = max(len(s) for s, _ in chosen)
            ids = torch.zeros(len(chosen), T, dtype=torch.long)
            mask = torch.zeros(len(chosen), T, dtype=torch.bool)
            for b, (s, m) in enumerate(chosen):
                ids[b, : len(s)] = torch.tensor(s)
                mask[b, : len(s)] = torch.tensor(m)
            yield ids, mask


def _mask(s: list[int], p: int | list[bool]) -> list[bool]:
    if isinstance(p, int):
        return [False] * min(p, len(s)) + [True] * (len(s) - p)
    if len(p) != len(s):
        raise ValueError(f"a mask of {len(p)} for a sequence of {len(s)} tokens")
    return [bool(x) for x in p]
