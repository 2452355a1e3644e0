"""Verification of drafted tokens: which drafts the target model accepts, and the token that follows them.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): drafts d_1..d_k were drawn from the draft
distributions q_1..q_k; the target model scored [last token, d_1..d_k] in one pass, giving p_1..p_{k+1}
(p_j is the target's distribution of the token at d_j's position). For j = 1..k:
    accept d_j with probability min(1, p_j(d_j) / q_j(d_j));
    on the first rejection emit a token drawn from norm(max(0, p_j - q_j)) and stop;
if all k are accepted, emit a "bonus" token drawn from p_{k+1}. Every emitted token is then distributed exactly
as if it had been sampled from the target model one step at a time, whatever q is: speculation changes speed,
never the distribution. Under greedy decoding (temperature 0) p_j is one-hot at its argmax, so a draft is
accepted iff it equals the target's argmax and the emitted tokens are exactly greedy decoding's.

p is the distribution the plain sampler would draw from (serve/engine/sampler.py: temperature, min-p, top-k,
top-p; greedy rows: log_softmax of the raw logits), so the logprob recorded with each emitted token is the
target's, as RL needs. Penalties depend on the tokens before each position, so requests with penalties are
not speculated (the proposer drafts nothing for them) and never reach this module.

Shapes: R = k + 1 verification rows, K = k drafts, V = vocabulary.
"""

from __future__ import annotations

import torch

from serve.engine.sampler import filter_logits
from serve.engine.sampling_params import SamplingParams
from serve.engine.sequence import TokenLogprob


def processed_logprobs(logits_RV: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """log of the distribution the sampler draws from, for rows that share one request's params ([R, V])."""
    logits_RV = logits_RV.float()
    if params.greedy:
        return logits_RV.log_softmax(-1)
    R = logits_RV.shape[0]
    top_k = torch.full((R,), params.top_k, dtype=torch.long)
    top_p = torch.full((R,), params.top_p, dtype=torch.float32)
    min_p = torch.full((R,), params.min_p, dtype=torch.float32)
    return filter_logits(logits_RV / params.temperature, top_k, top_p, min_p).log_softmax(-1)


def sample_from(probs_V: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs_V, 1, generator=generator))


def accept_greedy(logprobs_RV: torch.Tensor, drafts: list[int]) -> list[int]:
    """Tokens emitted by greedy verification: the drafts up to the first mismatch, then the target's argmax."""
    target = logprobs_RV.argmax(-1).tolist()
    out = []
    for j, d in enumerate(drafts):
        if d != target[j]:
            return out + [target[j]]
        out.append(d)
    return out + [target[len(drafts)]]


def rejection_sample(
    logprobs_RV: torch.Tensor, draft_probs_KV: torch.Tensor, drafts: list[int], generator: torch.Generator
) -> list[int]:
    """Tokens emitted by the speculative-sampling rule (module docstring); 1 to len(drafts)+1 of them."""
    p_RV = logprobs_RV.exp()
    out = []
    for j, d in enumerate(drafts):
        p, q = float(p_RV[j, d]), float(draft_probs_KV[j, d])
        u = float(torch.rand((), generator=generator))
        if u * q < p:  # u < p / q without dividing (q > 0: d was drawn from q)
            out.append(d)
            continue
        residual = (p_RV[j] - draft_probs_KV[j]).clamp_(min=0)
        # residual sums to 0 only if p == q, where rejection has probability 0; guard against rounding anyway.
        out.append(sample_from(residual if float(residual.sum()) > 0 else p_RV[j], generator))
        return out
    out.append(sample_from(p_RV[len(drafts)], generator))
    return out


def verify(
    logits_RV: torch.Tensor,
    drafts: list[int],
    draft_probs_KV: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator,
) -> list[TokenLogprob]:
    """One sequence's verification rows -> the emitted tokens with their target logprobs (and top-n)."""
    if logits_RV.shape[0] != len(drafts) + 1:
        raise ValueError(f"{logits_RV.shape[0]} verification rows for {len(drafts)} drafts (need drafts + 1)")
    logprobs_RV = processed_logprobs(logits_RV, params)
    if params.greedy:
        tokens = accept_greedy(logprobs_RV, drafts)
    else:
        if draft_probs_KV is None:
            raise ValueError("sampled drafts need their draft probabilities")
        tokens = rejection_sample(logprobs_RV, draft_probs_KV, drafts, generator)
    n_top = params.logprobs or 0
    out = []
    for j, tok in enumerate(tokens):
        row = logprobs_RV[j]
        top = {}
        if n_top:
            vals, ids = row.topk(min(n_top, row.shape[-1]))
            top = {t: v for t, v in zip(ids.tolist(), vals.tolist(), strict=True) if v != float("-inf")}
        out.append(TokenLogprob(tok, float(row[tok]), top))
    return out


def draft_tokens(
    logits_BV: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> tuple[list[int], list[torch.Tensor | None]]:
    """Draw one draft token per row from the draft logits: argmax for greedy requests, else a sample from q
    (the draft logits under the request's temperature and filters) -> (tokens, q rows or None for greedy)."""
    tokens, qs = [], []
    for b, p in enumerate(params):
        if p.greedy:
            tokens.append(int(logits_BV[b].argmax()))
            qs.append(None)
            continue
        q = processed_logprobs(logits_BV[b : b + 1], p)[0].exp()
        tokens.append(sample_from(q, generators[b]))
        qs.append(q)
    return tokens, qs
