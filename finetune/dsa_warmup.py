"""DSA adaptation (DeepSeek-V3.2's recipe, which GLM-5 follows, report §2.1): teach the lightning indexer to
pick the keys that the main attention would weigh most.

1. Dense warm-up (`train_dense_warmup`): the model attends densely (every key) and is frozen; only the indexers
   train, each by the KL divergence from its layer's attention distribution to its own:
       p[t, :] = sum_h softmax(q_h . k / sqrt(d))[t, :], L1-normalised      (the main attention, summed over heads)
       L_I = sum_t KL(p[t, :] || softmax(I[t, :]))                           (I = the indexer's scores)
2. Sparse training (`train_sparse`): attention runs over the indexer's top-k; the main model trains on the LM
   loss while each indexer trains on the same KL restricted to the keys it selected. The indexer's input is
   detached from the main model's graph, so the indexer is optimised only by its KL and the main model only by
   the LM loss (the model's own selection runs without autograd: top-k indices carry no gradient anyway).

How the losses see each layer: `LayerTap` records every indexer layer's MLA input (the hidden after
input_layernorm, rope tables, query indices) and its top-k as the model runs; `attention_target` recomputes
that layer's attention probabilities in plain PyTorch (the reference math of MLA.attend_expanded, without
autograd) and `indexer_log_probs` runs the indexer on the detached input. The model code itself is unchanged.

Shapes: B batch, T tokens (queries), S keys (= T: no cache in training), H heads, K index_topk.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from finetune.data.batches import padded_batches
from finetune.sft import sft_loss
from finetune.train_loop import LossTerms, OptimConfig, train


@dataclass(frozen=True)
class DSAWarmupConfig:
    """Both stages: steps and peak learning rate of each (DeepSeek-V3.2: 1e-3 for the warm-up), the batch."""

    warmup_steps: int = 100
    warmup_lr: float = 1e-3
    sparse_steps: int = 0  # 0: the dense warm-up alone
    sparse_lr: float = 1e-5
    batch_size: int = 4
    seed: int = 0
    grad_clip: float = 1.0

    def optim(self, stage: str) -> OptimConfig:
        steps, lr = (self.warmup_steps, self.warmup_lr) if stage == "warmup" else (self.sparse_steps, self.sparse_lr)
        return OptimConfig(steps, lr, max(1, steps // 20), 0.0, 0.0)  # clipping per part in the step, below


@dataclass
class _Record:
    x: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q_idx: torch.Tensor
    topk: torch.Tensor | None


@dataclass
class LayerTap:
    """Forward hooks on every MLA that has its own indexer: `records[i]` is that layer's last input and top-k.
    `mtp`: the MTP layer's too (index num_hidden_layers: its input is the MTP step's, one token shorter)."""

    model: object
    records: dict[int, _Record] = field(default_factory=dict)
    mtp: bool = False

    def __post_init__(self) -> None:
        self.layers = indexer_layers(self.model, self.mtp)
        self.hooks = [
            layer.self_attn.register_forward_hook(self._hook(i), with_kwargs=True) for i, layer in self.layers.items()
        ]

    def _hook(self, i: int):
        def record(_mla, args, _kwargs, output):
            x, cos, sin, q_idx = args[:4]
            # Without autograd the decoder layer sums residuals in place into fresh outputs: keep a copy.
            x = x if torch.is_grad_enabled() else x.clone()
            self.records[i] = _Record(x, cos, sin, q_idx, output[1])

        return record

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def indexer_layers(model, mtp: bool = False) -> dict:
    """The main layers that run an indexer of their own ('full'), by index; with `mtp` the MTP layers too."""
    n = model.config.num_hidden_layers
    layers = model.model.layers if mtp else model.model.layers[:n]
    return {i: layer for i, layer in enumerate(layers) if layer.self_attn.indexer is not None}


def indexer_parameters(model, mtp: bool = False) -> list[tuple[str, torch.Tensor]]:
    """The main layers' indexer parameters; with `mtp` the MTP layers' indexers too (the rest of that layer
    stays frozen)."""
    prefixes = tuple(f"model.layers.{i}.self_attn.indexer." for i in indexer_layers(model, mtp))
    return [(n, p) for n, p in model.named_parameters() if n.startswith(prefixes)]


@contextmanager
def dense_attention(model):
    """Every indexer's budget (the MTP layer's too) past any sequence length, so `select` returns None and
    attention is dense."""
    from model.indexer import Indexer

    indexers = [m for m in model.modules() if isinstance(m, Indexer)]
    saved = [ix.topk for ix in indexers]
    for ix in indexers:
        ix.topk = 1 << 62
    try:
        yield
    finally:
        for ix, k in zip(indexers, saved, strict=True):
            ix.topk = k


def visible_keys(q_idx: torch.Tensor, S: int, topk_BTK: torch.Tensor | None, B: int) -> torch.Tensor:
    """[B, T, S] bool: causal, and (sparse) within each query's top-k."""
    causal = torch.arange(S, device=q_idx.device) <= q_idx[..., None]  # [(B,) T, S]
    causal = causal.expand(B, -1, -1) if causal.dim() == 2 else causal
    if topk_BTK is None:
        return causal
    chosen = torch.zeros_like(causal).scatter_(2, topk_BTK, True)
    return causal & chosen


_PROB_ELEMS = 1 << 26  # heads per chunk of the target so that [B, heads, T, S] stays below ~64M floats


@torch.no_grad()
def attention_probs(mla, rec: _Record, heads: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's attention probabilities for `heads` -> (probs [B, h, T, S] fp32, qr [B, T, Q]). Plain math
    (scores, mask, softmax: MLA.attend_expanded's reference) over the keys the layer attended to: dense, or its
    top-k."""
    x = rec.x.detach()
    B, T, _ = x.shape
    q_nope, q_pe, qr = mla.project_q(x, rec.cos, rec.sin)
    c_kv, k_pe = mla.project_kv(x, rec.cos, rec.sin)
    k_nope = mla.kv_b_proj(c_kv).view(B, T, mla.n_heads, mla.dn + mla.dv)[..., : mla.dn]
    q_nope, q_pe, k_nope = q_nope[:, :, heads], q_pe[:, :, heads], k_nope[:, :, heads]
    scores = torch.einsum("bthd,bshd->bhts", q_nope.float(), k_nope.float())
    scores = (scores + torch.einsum("bthr,bsr->bhts", q_pe.float(), k_pe.float())) * mla.scale
    visible = visible_keys(rec.q_idx, T, rec.topk, B)
    return scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1), qr


def attention_target(mla, rec: _Record) -> tuple[torch.Tensor, torch.Tensor]:
    """The KL target: the attention summed over heads and L1-normalised -> (p [B, T, S] fp32, qr [B, T, Q]).
    Summed a chunk of heads at a time, so the [B, H, T, S] probabilities of a long sequence never all exist.
    (Each chunk projects q and k again: cheap next to the [T, S] scores.)"""
    B, T, _ = rec.x.shape
    chunk = max(1, _PROB_ELEMS // (B * T * T))
    total, qr = None, None
    for h0 in range(0, mla.n_heads, chunk):
        probs, qr = attention_probs(mla, rec, slice(h0, h0 + chunk))
        total = probs.sum(1) if total is None else total.add_(probs.sum(1))
    return total / mla.n_heads, qr  # the sum of H distributions, L1-normalised


def indexer_log_probs(indexer, rec: _Record, qr: torch.Tensor) -> torch.Tensor:
    """log softmax of the indexer's scores over the same keys -> [B, T, S] (-inf off them). Its inputs are
    detached: only the indexer's own parameters get gradient from what is computed from this."""
    x, qr = rec.x.detach(), qr.detach()
    k = indexer.keys(x, rec.cos, rec.sin)
    q = indexer.queries(qr, rec.cos, rec.sin)
    scores = indexer.scores(q, x, k)  # [B, T, S] fp32
    visible = visible_keys(rec.q_idx, x.shape[1], rec.topk, x.shape[0])
    return scores.masked_fill(~visible, float("-inf")).log_softmax(-1)


def indexer_kl(model, tap: LayerTap, query_mask_BT: torch.Tensor) -> torch.Tensor:
    """sum_t KL(p_t || softmax(I_t)) per layer, averaged over the masked query tokens and the indexer layers
    that ran (a layer with no record this step, the MTP layer in the sparse stage, is left out). A layer that
    ran on fewer tokens (the MTP layer: row t is main position t+1) takes the mask's last columns."""
    total, ran = torch.zeros(()), 0
    for i, layer in tap.layers.items():
        rec = tap.records.get(i)
        if rec is None:
            continue
        T = rec.x.shape[1]
        mask = query_mask_BT[:, query_mask_BT.shape[1] - T :]
        p, qr = attention_target(layer.self_attn, rec)
        logq = indexer_log_probs(layer.self_attn.indexer, rec, qr)
        # xlogy: 0 * log 0 = 0 for keys the target gives no weight; where p > 0 the key is visible, logq finite.
        kl_BT = (torch.xlogy(p, p) - torch.where(p > 0, p * logq, torch.zeros_like(p))).sum(-1)
        total, ran = total + (kl_BT * mask).sum() / mask.sum().clamp(min=1), ran + 1
    return total / max(1, ran)


def warmup_loss(model, ids_BT: torch.Tensor, real_BT: torch.Tensor, tap: LayerTap) -> LossTerms:
    """Stage 1: a dense, frozen forward (no autograd), then the indexers' KL to it over every real token. With
    the MTP layer in the tap, its first draft step runs too (dense, on the main model's hidden), so its indexer
    learns the attention it drafts with."""
    with torch.no_grad(), dense_attention(model):
        positions = _positions(ids_BT)
        hidden = model.model(ids_BT, positions)
        if tap.mtp and ids_BT.shape[1] > 1:
            model.mtp_forward(hidden[:, :-1], ids_BT[:, 1:], positions[:, 1:], step=0, logits=False)
    kl = indexer_kl(model, tap, real_BT)
    return LossTerms(kl, float(kl.detach()), tokens=int(real_BT.sum()))


def sparse_losses(model, ids_BT, target_BT, real_BT, tap: LayerTap) -> tuple[LossTerms, torch.Tensor]:
    """Stage 2: the LM loss of the sparse forward (main model) and the indexers' KL over their selection."""
    lm = sft_loss(model, ids_BT, target_BT)
    return lm, indexer_kl(model, tap, real_BT)


def _positions(ids_BT: torch.Tensor) -> torch.Tensor:
    return torch.arange(ids_BT.shape[1], device=ids_BT.device).expand(ids_BT.shape[0], -1)


def _batches(seqs, cfg: DSAWarmupConfig):
    """(ids, target mask, real-token mask): two identically shuffled streams over the sequences with targets."""
    seqs = [(s, m) for s, m in seqs if len(s) >= 2 and (any(m) if isinstance(m, list) else len(s) > m)]
    if not seqs:
        raise ValueError("no sequence of 2 or more tokens with targets to train on")
    whole = [(s, [True] * len(s)) for s, _ in seqs]
    targets = padded_batches(seqs, cfg.batch_size, 2, cfg.seed)
    real = padded_batches(whole, cfg.batch_size, 2, cfg.seed)
    for (ids, target), (ids2, real_mask) in zip(targets, real, strict=True):  # both endless
        assert torch.equal(ids, ids2)
        yield ids, target, real_mask


def train_dense_warmup(model, seqs, cfg: DSAWarmupConfig, **loop) -> list[LossTerms]:
    """Stage 1: the indexers alone (every other parameter frozen, untouched), the MTP layer's among them: it
    drafts through its own indexer's top-k at serving. `loop`: train()'s resume / save / save_every / on_step.
    -> each step's loss (`lm` holds the KL)."""
    for p in model.parameters():
        p.requires_grad_(False)
    named = indexer_parameters(model, mtp=True)
    if not named:
        raise ValueError("this model has no DSA indexer to warm up")
    for _, p in named:
        p.requires_grad_(True)
    tap = LayerTap(model, mtp=True)
    params = [p for _, p in named]

    def step(batch) -> LossTerms:
        ids, _, real = batch
        out = warmup_loss(model, ids, real, tap)
        out.loss.backward()
        _clip(params, cfg.grad_clip)
        return LossTerms(out.loss.detach(), out.lm, tokens=out.tokens)

    try:
        return train(model, named, _batches(seqs, cfg), step, cfg.optim("warmup"), **loop)
    finally:
        tap.close()


def train_sparse(model, seqs, cfg: DSAWarmupConfig, **loop) -> list[LossTerms]:
    """Stage 2: the main model (MTP layer frozen, as full SFT) on the LM loss of sparse attention, each main
    layer's indexer on its KL over its top-k (the MTP layer does not run here; its indexer keeps its warm-up).
    Each part is clipped on its own, so neither's gradient norm scales the other's.
    -> each step's LM loss (`lm`), with the indexers' KL in `mtp[0]` (kept with the loss history on resume)."""
    from finetune.full import FullSettings, prepare_full

    main = prepare_full(model, FullSettings())
    index = indexer_parameters(model)
    for _, p in index:
        p.requires_grad_(True)
    tap = LayerTap(model)
    main_params, index_params = [p for _, p in main], [p for _, p in index]

    def step(batch) -> LossTerms:
        ids, target, real = batch
        lm, kl = sparse_losses(model, ids, target, real, tap)
        (lm.loss + kl).backward()  # disjoint graphs: lm reaches only the main model, kl only the indexers
        _clip(main_params, cfg.grad_clip)
        _clip(index_params, cfg.grad_clip)
        return LossTerms(lm.loss.detach(), lm.lm, [float(kl.detach())], tokens=lm.tokens)

    try:
        return train(model, main + index, _batches(seqs, cfg), step, cfg.optim("sparse"), **loop)
    finally:
        tap.close()


def _clip(params: list[torch.Tensor], max_norm: float) -> None:
    if max_norm:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
