"""Greedy MTP speculative decoding with the plain model and no cache: the reference the engine is checked
against, and an offline way to measure how useful a checkpoint's MTP drafts are (acceptance length).

Everything is recomputed from the whole sequence at each step, so it is slow and obviously right:
- drafts: the MTP layer's context holds one entry per position p >= 1 made from (main hidden h_{p-1}, token
  x_p); draft 1 is the layer's output at the newest position e; draft j+1 runs the layer again with its own
  output and draft j appended at position e+j (GLM-5 chains its one layer). This is exactly what the engine's
  paged MTP cache holds (serve/engine/spec_decode.py).
- verification: the main model over the sequence plus the drafts; accept while draft j equals the argmax at
  its position, then add the argmax after the last accepted one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@torch.inference_mode()
def mtp_drafts(model, token_ids: list[int], k: int) -> list[int]:
    """The k greedy chained drafts that follow `token_ids` (its last token is the newest, not yet verified)."""
    T = len(token_ids)
    if T < 2:
        raise ValueError("need at least 2 tokens: the MTP layer has no entry at position 0")
    ids = torch.tensor([token_ids])
    _, h = model(ids, return_hidden=True)
    hidden, tokens = h[:, : T - 1], ids[:, 1:]  # entry p (1..T-1): (h_{p-1}, x_p)
    drafts: list[int] = []
    for _ in range(k):
        n = tokens.shape[1]
        logits, z = model.mtp_forward(hidden, tokens, torch.arange(1, n + 1))
        d = int(logits[0, -1].argmax())
        drafts.append(d)
        hidden = torch.cat([hidden, z[:, -1:]], dim=1)
        tokens = torch.cat([tokens, torch.tensor([[d]])], dim=1)
    return drafts


@dataclass
class SpecResult:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # drafts accepted at each verification

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per verification (accepted + 1)."""
        return 1.0 + sum(self.accepted) / len(self.accepted) if self.accepted else 0.0


@torch.inference_mode()
def speculative_greedy(model, prompt: list[int], k: int, max_tokens: int) -> SpecResult:
    """Greedy generation of `max_tokens` tokens with k MTP drafts per step (output == plain greedy)."""
    seq = list(prompt)
    logits = model(torch.tensor([seq]))[0, -1]
    seq.append(int(logits.argmax()))
    res = SpecResult([seq[-1]])
    while len(res.tokens) < max_tokens:
        kk = min(k, max_tokens - len(res.tokens) - 1)
        drafts = mtp_drafts(model, seq, kk) if kk > 0 else []
        target = model(torch.tensor([seq + drafts]))[0, len(seq) - 1 :].argmax(-1).tolist()
        a = 0
        while a < len(drafts) and drafts[a] == target[a]:
            a += 1
        new = drafts[:a] + [target[a]]
        seq += new
        res.tokens += new
        if drafts:
            res.accepted.append(a)
    res.tokens = res.tokens[:max_tokens]
    return res
