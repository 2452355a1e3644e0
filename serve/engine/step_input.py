"""The step as the runner sees it: `StepInput` (the flattened tokens of a step, their positions and cache slots)
and `SeqInput` (one chunk's place in it and its paged context). Plain data over tensors; moved from model_runner.py
so the plain and the fast path (fast_layer.py) share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SeqInput:
    """One chunk's place in the flattened step."""

    offset: int  # first row in the step's N tokens
    start: int  # position (= index in the sequence) of the first new token
    n: int  # new tokens
    block_table: torch.Tensor  # the sequence's blocks, covering positions 0..start+n-1
    block_size: int

    @property
    def ctx_len(self) -> int:
        return self.start + self.n

    @property
    def contiguous(self) -> bool:
        """Whether the blocks are consecutive (usual in a fresh pool): then the context is a view, not a copy."""
        if not hasattr(self, "_contiguous"):
            bt = self.block_table
            self._contiguous = len(bt) == 1 or bool((bt[1:] - bt[:-1] == 1).all())
        return self._contiguous

    # Context index i lives in the slot of position i + pos_offset (the MTP layer's entries start at position 1).
    pos_offset = 0

    def gather(self, paged_NPX: torch.Tensor) -> torch.Tensor:
        """This sequence's whole context [L, X] from a paged tensor: a view if its blocks are consecutive,
        else copied block by block."""
        rows = slice(self.pos_offset, self.pos_offset + self.ctx_len)
        if self.contiguous:
            first = int(self.block_table[0])
            return paged_NPX[first : first + len(self.block_table)].flatten(0, 1)[rows]
        return paged_NPX[self.block_table].flatten(0, 1)[rows]

    def slots(self, idx: torch.Tensor) -> torch.Tensor:
        """Cache slots of context indices `idx` (sequence positions idx + pos_offset)."""
        if self.contiguous:  # consecutive blocks: one add
            return idx + (int(self.block_table[0]) * self.block_size + self.pos_offset)
        pos = idx + self.pos_offset if self.pos_offset else idx
        return self.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    @property
    def rows(self) -> slice:
        return slice(self.offset, self.offset + self.n)

    @property
    def q_idx(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.n, device=self.block_table.device)


@dataclass
class StepInput:
    input_ids_N: torch.Tensor
    positions_N: torch.Tensor
    slots_N: torch.Tensor
    seqs: list[SeqInput]
    sample_rows: list[int]  # row of the last token of each sampling chunk
    # Per-step values every layer would otherwise rebuild (decode rows, dense decode slots): filled lazily.
    memo: dict = field(default_factory=dict)
