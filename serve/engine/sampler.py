"""Batched sampling with per-request parameters, per-request random streams and exact logprobs.

Shapes: B = sequences sampled this step, V = vocabulary.

The order of processing, per row:
  1. penalties on the raw logits: repetition (prompt + output tokens, as in vLLM / HF: divide positive
     logits, multiply negative ones), then frequency and presence (output tokens only, OpenAI semantics);
  2. greedy rows (temperature 0) take the argmax; their distribution is log_softmax of the penalised logits;
  3. other rows: divide by temperature, then min-p (on the tempered distribution), top-k, top-p set the
     dropped tokens to -inf, and the token is drawn from softmax of what is left.

The logprob returned for a token (and the top-n alternatives) is log_softmax of exactly the row that was
sampled from (step 2 or 3): RL needs the probability the behaviour policy actually used. With
temperature 1 and no filters or penalties that is log_softmax of the model's logits.

A request with a grammar (`SamplingParams.constraint`, serve/engine/grammar.py) has the logits of the tokens
its grammar does not allow next set to -inf after the penalties, so every later step -- and the logprobs --
see the constrained distribution. Rows without one are not touched.

Random draws use the exponential-race form of sampling, argmax(p / q) with q ~ Exp(1), with q drawn from
the sequence's own torch.Generator, so a seeded request gives the same tokens whatever else is in the
batch (as long as its logits are the same).
"""

from __future__ import annotations

import weakref

import torch

from serve.engine.sequence import Sequence, TokenLogprob


def apply_penalties(logits_BV: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition / frequency / presence penalties, in place, for the rows whose params ask for them."""
    V = logits_BV.shape[-1]
    for b, seq in enumerate(seqs):
        p = seq.params
        if not p.has_penalties:
            continue
        row = logits_BV[b]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
            seen = seen[seen < V]
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            out = torch.tensor(seq.output_token_ids, dtype=torch.long)
            out = out[out < V]
            counts = torch.bincount(out, minlength=V).to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return logits_BV


def filter_logits(logits_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor, min_p_B: torch.Tensor):
    """Set to -inf what min-p, top-k and top-p drop. top_k 0 = off, top_p 1 = off, min_p 0 = off."""
    V = logits_BV.shape[-1]
    if bool((min_p_B > 0).any()):
        probs = logits_BV.softmax(-1)
        floor_B1 = min_p_B[:, None] * probs.max(-1, keepdim=True).values
        logits_BV = logits_BV.masked_fill(probs < floor_B1, float("-inf"))
    use_k = bool((top_k_B > 0).any())
    use_p = bool((top_p_B < 1).any())
    if not (use_k or use_p):
        return logits_BV
    sorted_BV, order_BV = logits_BV.sort(-1, descending=True)
    drop_BV = torch.zeros_like(sorted_BV, dtype=torch.bool)
    if use_k:
        k_B = torch.where(top_k_B > 0, top_k_B, torch.full_like(top_k_B, V)).clamp(max=V)
        drop_BV |= torch.arange(V)[None, :] >= k_B[:, None]
        sorted_BV = sorted_BV.masked_fill(drop_BV, float("-inf"))
    if use_p:
        probs_BV = sorted_BV.softmax(-1)
        before_BV = probs_BV.cumsum(-1) - probs_BV  # mass strictly before each token
        # A token is kept while the mass before it is below top_p; rows with top_p == 1 keep everything.
        limit_B1 = torch.where(top_p_B < 1, top_p_B, torch.full_like(top_p_B, float("inf")))[:, None]
        drop_BV |= before_BV >= limit_B1
        drop_BV[:, 0] = False
    drop_BV = torch.zeros_like(drop_BV).scatter(-1, order_BV, drop_BV)
    return logits_BV.masked_fill(drop_BV, float("-inf"))


class Sampler:
    """Turns the logits of the last position of each sampling sequence into tokens and logprobs."""

    def __init__(self) -> None:
        # Each constrained sequence's place in its grammar; it goes when the sequence does.
        self._grammar_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def apply_constraints(self, logits_BV: torch.Tensor, seqs: list[Sequence]) -> None:
        """Mask, in place, the rows of sequences whose params carry a grammar."""
        for b, seq in enumerate(seqs):
            grammar = seq.params.constraint
            if grammar is None:
                continue
            state = self._grammar_states.get(seq)
            if state is None:
                state = self._grammar_states[seq] = grammar.start()
            state.mask_(logits_BV[b], seq.output_token_ids)

    def __call__(self, logits_BV: torch.Tensor, seqs: list[Sequence]) -> list[TokenLogprob]:
        if logits_BV.shape[0] != len(seqs):
            raise ValueError(f"{logits_BV.shape[0]} rows of logits for {len(seqs)} sequences")
        logits_BV = apply_penalties(logits_BV.float().clone(), seqs)
        self.apply_constraints(logits_BV, seqs)
        params = [s.params for s in seqs]
        greedy_B = torch.tensor([p.greedy for p in params])
        temp_B = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], dtype=torch.float32)
        top_k_B = torch.tensor([0 if p.greedy else p.top_k for p in params], dtype=torch.long)
        top_p_B = torch.tensor([1.0 if p.greedy else p.top_p for p in params], dtype=torch.float32)
        min_p_B = torch.tensor([0.0 if p.greedy else p.min_p for p in params], dtype=torch.float32)

        processed_BV = filter_logits(logits_BV / temp_B[:, None], top_k_B, top_p_B, min_p_B)
        logprobs_BV = processed_BV.log_softmax(-1)

        tokens_B = logprobs_BV.argmax(-1)
        if not bool(greedy_B.all()):
            for b, seq in enumerate(seqs):
                if params[b].greedy:
                    continue
                q_V = torch.empty(logprobs_BV.shape[-1]).exponential_(generator=seq.generator)
                tokens_B[b] = (logprobs_BV[b] - q_V.log()).argmax()

        chosen_B = logprobs_BV.gather(-1, tokens_B[:, None])[:, 0]
        max_n = max((p.logprobs or 0) for p in params)
        top_vals = top_ids = None
        if max_n > 0:
            top_vals, top_ids = logprobs_BV.topk(min(max_n, logprobs_BV.shape[-1]), dim=-1)
            top_vals, top_ids = top_vals.tolist(), top_ids.tolist()

        out = []
        for b, (tok, lp) in enumerate(zip(tokens_B.tolist(), chosen_B.tolist(), strict=True)):
            top = {}
            n = params[b].logprobs or 0
            if n and top_vals is not None:
                top = {t: v for t, v in zip(top_ids[b][:n], top_vals[b][:n], strict=True) if v != float("-inf")}
            out.append(TokenLogprob(tok, lp, top))
        return out
