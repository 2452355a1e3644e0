"""Packing: short sequences share a row, each attending only to itself and counting positions from 0.

A row of `row_len` tokens holds whole sequences laid end to end (best fit, longest first, so a row wastes
little), then padding. Each token carries its sequence's segment id (1, 2, ...; 0 for padding) and its
position within that sequence: the model's `segment_ids` keeps attention and the indexer's top-k inside a
segment, and RoPE sees the positions each sequence would have alone, so a packed sequence computes what it
computes unpacked (tests/finetune/test_packing.py checks the loss). A sequence's first token is never a target
(nothing in its own segment predicts it). Sequences longer than a row go alone, cut to the row.

Shapes: B rows, T row_len.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def pack(lengths: list[int], row_len: int) -> list[list[int]]:
    """Sequence indices per row, best fit decreasing: each sequence, longest first, into the fullest row that
    still has room for it. Deterministic."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = min(lengths[i], row_len)
        fits = [r for r in range(len(rows)) if room[r] >= n]
        if fits:
            r = min(fits, key=lambda r: (room[r], r))
            rows[r].append(i)
            room[r] -= n
        else:
            rows.append([i])
            room.append(row_len - n)
    return rows


def packed_row(seqs: list[tuple[list[int], list[bool]]], row_len: int) -> tuple[torch.Tensor, ...]:
    """(ids, mask, positions, segment_ids), each [row_len], of sequences laid end to end."""
    ids = torch.zeros(row_len, dtype=torch.long)
    mask = torch.zeros(row_len, dtype=torch.bool)
    pos = torch.zeros(row_len, dtype=torch.long)
    seg = torch.zeros(row_len, dtype=torch.long)
    at = 0
    for k, (s, m) in enumerate(seqs, 1):
        n = min(len(s), row_len - at)
        ids[at : at + n] = torch.tensor(s[:n])
        mask[at + 1 : at + n] = torch.tensor(m[1:n], dtype=torch.bool)
        pos[at : at + n] = torch.arange(n)
        seg[at : at + n] = k
        at += n
    pos[at:] = torch.arange(row_len - at)  # padding: a segment of its own, attending only to itself
    return ids, mask, pos, seg


def packed_batches(
    seqs: list[tuple[list[int], list[bool]]], row_len: int, rows_per_batch: int, seed: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Endless shuffled batches of packed rows: (ids, mask, positions, segment_ids), each [B, row_len]. The
    rows are packed once; the epoch order of rows comes from `seed` (exact resume)."""
    usable = [(s, m) for s, m in seqs if any(m[1:])]
    if not usable:
        raise ValueError("no sequence has a target token")
    rows = [[usable[i] for i in r] for r in pack([len(s) for s, _ in usable], row_len)]
    T = min(row_len, max(sum(len(s) for s, _ in r) for r in rows))  # no longer than the fullest row
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(rows), generator=gen).tolist()
        for start in range(0, max(1, len(rows) - rows_per_batch + 1), rows_per_batch):
            parts = [packed_row(rows[i], T) for i in order[start : start + rows_per_batch]]
            yield tuple(torch.stack(x) for x in zip(*parts, strict=True))
