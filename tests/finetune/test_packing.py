"""Packing: rows hold whole sequences with their own positions and segments, and the packed loss is the
unpacked loss (no attention, and no top-k choice, crosses a sequence boundary)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from finetune.data.packing import pack, packed_batches, packed_row
from finetune.sft import sft_loss
from model import GLM5ForCausalLM
from model.config import preset

torch.set_num_threads(1)


def test_pack_fits_whole_sequences_best_fit_and_rows_carry_positions_and_segments():
    rows = pack([5, 3, 8, 2, 6], row_len=10)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 3, 4]
    assert all(sum([5, 3, 8, 2, 6][i] for i in r) <= 10 for r in rows) and len(rows) == 3
    ids, mask, pos, seg = packed_row([([1, 2, 3], [True, True, True]), ([4, 5], [False, True])], 7)
    assert ids.tolist() == [1, 2, 3, 4, 5, 0, 0]
    assert pos.tolist() == [0, 1, 2, 0, 1, 0, 1] and seg.tolist() == [1, 1, 1, 2, 2, 0, 0]
    assert mask.tolist() == [False, True, True, False, True, False, False]  # a sequence's first token: never


def _unpacked_loss(model, seqs):
    total, count = 0.0, 0
    for s, m in seqs:
        ids = torch.tensor([s])
        logits = model(ids)[0, :-1]
        ce = F.cross_entropy(logits, ids[0, 1:], reduction="none")
        w = torch.tensor(m[1:], dtype=torch.float32)
        total, count = total + float((ce * w).sum()), count + int(w.sum())
    return total / count


@pytest.mark.parametrize("lengths", [(5, 9, 12, 7, 16, 3), (21, 34, 40, 18, 27)])  # within / past index_topk (16)
def test_packed_loss_equals_unpacked_loss(lengths):
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=1).eval()
    g = torch.Generator().manual_seed(0)
    seqs = []
    for n in lengths:
        s = torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist()
        m = (torch.rand(n, generator=g) > 0.3).tolist()
        seqs.append((s, m))
    with torch.no_grad():
        want = _unpacked_loss(model, seqs)
    batch = next(packed_batches(seqs, row_len=64, rows_per_batch=8))
    assert batch[0].shape[0] == len(pack(list(lengths), 64)) < len(lengths)  # several sequences share rows
    with torch.no_grad():
        got = sft_loss(model, *batch).lm
        crossed = sft_loss(model, batch[0], batch[1]).lm  # the same rows without boundaries: cross-talk
    assert got == pytest.approx(want, rel=1e-5)
    assert abs(crossed - want) > 1e-4 * abs(want)  # a random tiny model's logits are flat: small, but there
