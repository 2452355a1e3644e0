"""The feed-forward blocks: SwiGLU MLP (dense layers, each expert, the shared expert), the router, and the MoE.

Routing (DeepSeek-V3 `noaux_tc`, reference §4), in fp32:
    s = sigmoid(x @ gate.weight^T)                      [N, E] affinity of each token to each expert
    choice = s + e_score_correction_bias                the bias only steers *which* experts are picked (it is
                                                        tuned for load balance, not learned by gradient)...
    group-limited: keep the topk_group groups (of n_group) with the best sum of their top-2 choice scores
    idx = topk(choice, k); w = s[idx]                   ...the mixing weights come from the unbiased scores
    w = w / sum(w) (norm_topk_prob) * routed_scaling_factor
    y = sum_k w_k * expert_{idx_k}(x) + shared_expert(x)

Experts are stored one nn.Linear per projection per expert (`experts.{e}.gate_proj`, ...), as in the
checkpoint, so peft and INT4 module swaps see ordinary Linear layers. The fast path (`grouped`) sorts the
(token, slot) pairs by expert and calls each expert once on its contiguous slice: one Python iteration per
expert that received tokens, never per token. It calls the expert modules themselves and caches nothing, so
it stays correct when weights change (optimizer steps, loading, LoRA wrapping, INT4 swaps). The plain path
(`dense_loop`) runs every expert on every token and mixes with the dense [N, E] weight matrix: slow, obviously
right, and what the fast path is tested against.

Shapes: N tokens (B*T flattened), D hidden, E routed experts, k experts per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import GLM5Config


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Sigmoid top-k router with the selection-only correction bias (`mlp.gate.*` in the checkpoint)."""

    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__()
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.norm_topk_prob, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        # A buffer: saved and loaded, but not trained by gradient (it is set by the load-balancing rule).
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))

    def forward(self, x_ND: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (weights [N, k] fp32, expert indices [N, k] int64)."""
        scores = F.linear(x_ND.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        if self.n_group > 1:
            grouped = choice.view(x_ND.shape[0], self.n_group, -1)
            group_score = grouped.topk(2, dim=-1).values.sum(-1)  # [N, n_group]
            keep = torch.zeros_like(group_score, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(self.topk_group, dim=-1).indices, True)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).view_as(choice)
        idx = choice.topk(self.top_k, dim=-1).indices
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * self.scaling, idx


class MoE(nn.Module):
    """Routed experts + shared expert. `impl`: 'grouped' (fast) or 'dense_loop' (the plain reference)."""

    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__()
        self.n_experts = cfg.n_routed_experts
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(
            [MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.n_routed_experts)]
        )
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
        self.impl = "grouped"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_ND = x.reshape(-1, shape[-1])
        w, idx = self.gate(x_ND)
        routed = self.routed_grouped(x_ND, w, idx) if self.impl == "grouped" else self.routed_dense_loop(x_ND, w, idx)
        return (routed + self.shared_experts(x_ND)).view(shape)

    def routed_grouped(self, x_ND: torch.Tensor, w_Nk: torch.Tensor, idx_Nk: torch.Tensor) -> torch.Tensor:
        k = idx_Nk.shape[1]
        flat = idx_Nk.flatten()
        order = flat.argsort(stable=True)  # (token, slot) pairs sorted by expert
        token = order // k
        counts = torch.bincount(flat, minlength=self.n_experts).tolist()  # one host sync per layer
        xs = x_ND[token]
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                outs.append(self.experts[e](xs[start : start + n]))
                start += n
        ys = torch.cat(outs) * w_Nk.flatten()[order, None].to(x_ND.dtype)
        return torch.zeros_like(x_ND).index_add_(0, token, ys)

    def routed_dense_loop(self, x_ND: torch.Tensor, w_Nk: torch.Tensor, idx_Nk: torch.Tensor) -> torch.Tensor:
        dense_w = torch.zeros(x_ND.shape[0], self.n_experts, dtype=w_Nk.dtype, device=x_ND.device)
        dense_w.scatter_(1, idx_Nk, w_Nk)
        out = torch.zeros_like(x_ND)
        for e, expert in enumerate(self.experts):
            out = out + dense_w[:, e : e + 1].to(x_ND.dtype) * expert(x_ND)
        return out
