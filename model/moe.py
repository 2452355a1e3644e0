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
checkpoint, so peft and INT4 module swaps see ordinary Linear layers. The fast path (`routed`) sorts the
(token, slot) pairs by expert so that each expert's tokens are one contiguous slice, then either
- runs every expert in two grouped GEMMs over two stacked tensors that the experts' weights are views of
  (`tie_experts`, `routed_stacked`), while the tie holds (checked on every call), or
- calls each expert module once on its slice (`routed_per_expert`): one Python iteration per expert that got
  tokens, never per token. It caches nothing, so it is right whatever happened to the weights (training,
  LoRA, INT4).
The reference (`impl="reference"`, `routed_dense_loop`) runs every expert on every token and mixes with the
dense [N, E] weight matrix: slow, obviously right, and what the fast path is tested against.

Shapes: N tokens (B*T flattened), D hidden, E routed experts, k experts per token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from model import kernels
from model.config import GLM5Config


def swiglu(g: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's activation silu(g) * u (* w, one weight per row of 2-D g). Without autograd it is computed in
    place on g (a projection's fresh output), on CPU in one fused pass; every path gives the same bits."""
    if torch.is_grad_enabled():
        act = F.silu(g) * u
        return act if w is None else act * w[:, None]
    return kernels.silu_mul(g, u, w)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


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
    """Routed experts + shared expert.

    `impl`: 'fast' (the default: `routed`) or 'reference' (`routed_dense_loop`, the plain loop the fast path is
    tested against). See the module docstring and `tie_experts` for the stacked weights.
    """

    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__()
        self.n_experts, self.inter = cfg.n_routed_experts, cfg.moe_intermediate_size
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(
            [MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.n_routed_experts)]
        )
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
        self.impl = "fast"
        self._gate_up: torch.Tensor | None = None  # [E, D, 2I], the storage the experts' gate/up weights view
        self._down: torch.Tensor | None = None  # [E, I, D]
        self._tied_ptrs: list[tuple[int, int, int]] = []
        self.tie_experts()

    @torch.no_grad()
    def tie_experts(self) -> None:
        """Move every expert's weights into two stacked tensors and make each expert's `Linear.weight` a view
        of its slice, so that one grouped GEMM can run all experts with no copy and no second set of weights.

        The stacks are stored input-major, as the GEMM's right operand ([E, D, 2I] for gate|up, [E, I, D] for
        down): each expert's weight is the transposed view `stack[e].T`, an ordinary [out, in] Parameter with
        strides (1, out). On CPU the grouped GEMM over ~64-row groups runs 1.3-1.7x faster from this layout
        than from the checkpoint's [out, in] (measured, 1 thread), and a per-expert `F.linear` is no slower.

        The parameters stay per expert (names, optimizers, peft and INT4 swaps see ordinary Linear layers).
        Anything that replaces a weight tensor (loading with assign, `.to(dtype/device)`, wrapping or swapping
        a Linear) breaks the tie; `_stacked_ok` notices and the forward takes the per-expert path, which is
        always right. The loader re-ties after loading; call `GLM5ForCausalLM.tie_experts()` after moving.
        In-place updates (optimizer steps, `copy_`) keep the tie, since they write the shared storage.
        """
        ws = [(e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight) for e in self.experts]
        if not all(type(m) is nn.Linear for e in self.experts for m in (e.gate_proj, e.up_proj, e.down_proj)):
            return
        g0, _, d0 = ws[0]
        I, D = self.inter, g0.shape[1]  # noqa: E741
        gate_up = torch.empty(self.n_experts, D, 2 * I, dtype=g0.dtype, device=g0.device)
        down = torch.empty(self.n_experts, I, D, dtype=d0.dtype, device=d0.device)
        for e, (expert, (g, u, d)) in enumerate(zip(self.experts, ws, strict=True)):
            if not g.is_meta:
                gate_up[e, :, :I].copy_(g.T)
                gate_up[e, :, I:].copy_(u.T)
                down[e].copy_(d.T)
            expert.gate_proj.weight = nn.Parameter(gate_up[e, :, :I].T, requires_grad=g.requires_grad)
            expert.up_proj.weight = nn.Parameter(gate_up[e, :, I:].T, requires_grad=u.requires_grad)
            expert.down_proj.weight = nn.Parameter(down[e].T, requires_grad=d.requires_grad)
        self._gate_up, self._down = gate_up, down
        # Where each expert's gate, up and down weights must start for the tie to hold (checked every forward).
        self._tied_ptrs = [
            (gate_up[e].data_ptr(), gate_up[e, :, I:].data_ptr(), down[e].data_ptr()) for e in range(self.n_experts)
        ]

    def _stacked_ok(self) -> bool:
        """True if the stacked tensors are still the experts' weights and no gradient is needed through them."""
        if self._gate_up is None or not hasattr(torch, "_grouped_mm") or self._gate_up.is_meta:
            return False
        dtype, grad = self._gate_up.dtype, torch.is_grad_enabled()
        # torch's grouped GEMM takes rows of a multiple of 16 bytes only (D = 35 floats: "strides should be multiple
        # of 16 bytes"): odd sizes run the per-expert path.
        if any(n * self._gate_up.element_size() % 16 for n in (self._gate_up.shape[1], self.inter)):
            return False
        # The module and parameter dicts directly: nn.Module.__getattr__ on 3 x E linears is most of this check.
        for ex, ptrs in zip(self.experts, self._tied_ptrs, strict=True):
            mods = ex._modules
            for name, ptr in zip(("gate_proj", "up_proj", "down_proj"), ptrs, strict=True):
                lin = mods[name]
                if type(lin) is not nn.Linear:
                    return False
                w = lin._parameters["weight"]
                if w.data_ptr() != ptr or w.dtype != dtype:
                    return False
                if grad and w.requires_grad:
                    return False  # autograd must reach the per-expert parameters: use the module calls
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_ND = x.reshape(-1, shape[-1])
        w, idx = self.gate(x_ND)
        if self.impl == "reference":  # the plain loop, as written in the module docstring
            return (self.routed_dense_loop(x_ND, w, idx) + self.shared_experts(x_ND)).view(shape)
        # Fast: the routed experts' outputs go straight into the shared expert's output.
        return self.routed(x_ND, w, idx, out=self.shared_experts(x_ND)).view(shape)

    def routed(self, x_ND: torch.Tensor, w_Nk: torch.Tensor, idx_Nk: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The fast path: over the stacked weights while they are the experts' own, else through each expert."""
        if self._stacked_ok():
            return self.routed_stacked(x_ND, w_Nk, idx_Nk, out)
        return self.routed_per_expert(x_ND, w_Nk, idx_Nk, out)

    def _sort(self, idx_Nk: torch.Tensor):
        """(token, slot) pairs sorted by expert -> (order into the flat pairs, token of each, count per expert)."""
        flat = idx_Nk.flatten()
        order = flat.argsort(stable=True)
        return order, order // idx_Nk.shape[1], torch.bincount(flat, minlength=self.n_experts)

    def routed_stacked(
        self, x_ND: torch.Tensor, w_Nk: torch.Tensor, idx_Nk: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """All experts in two grouped GEMMs over the stacked weights (valid only when `_stacked_ok()`).
        The weighted sum per token is added into `out` [N, D] (in place) when given, else into zeros."""
        order, token, counts = self._sort(idx_Nk)
        out = torch.zeros_like(x_ND) if out is None else out
        # The routing weight scales the [N*k, I] activation rather than the [N*k, D] output: down is linear.
        w = w_Nk.flatten()[order].to(x_ND.dtype)
        # Gather, grouped GEMM, SwiGLU (in place on the GEMM's own output when nothing trains), grouped GEMM,
        # scatter-add; on CPU one fused call per layer, the same bits (model/kernels).
        return kernels.moe_experts(x_ND, token, w, counts, self._gate_up, self._down, out, swiglu=swiglu)

    def routed_per_expert(
        self, x_ND: torch.Tensor, w_Nk: torch.Tensor, idx_Nk: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Each expert module once, on its contiguous slice of the sorted tokens (added into `out` if given).
        A decode step of one or two tokens without autograd calls each token's k experts on that token alone:
        sorting, gathering and scattering k rows costs more than the experts' own calls (INT4, LoRA)."""
        return self.routed_each(x_ND, w_Nk, idx_Nk, out, lambda e, x: self.experts[e](x))

    def routed_each(
        self,
        x_ND: torch.Tensor,
        w_Nk: torch.Tensor,
        idx_Nk: torch.Tensor,
        out: torch.Tensor | None,
        expert: Callable[[int, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """`routed_per_expert` with expert e computed by `expert(e, x)`: the experts' modules, or a serving fast
        path's fused weights for them (serve/engine/fast_layer.py), the routing the same."""
        out = torch.zeros_like(x_ND) if out is None else out
        if x_ND.shape[0] <= 2 and not torch.is_grad_enabled():
            for t, (experts, weights) in enumerate(zip(idx_Nk.tolist(), w_Nk.tolist(), strict=True)):
                for e, wt in zip(experts, weights, strict=True):
                    out[t].add_(expert(e, x_ND[t : t + 1])[0].mul_(wt))
            return out
        order, token, counts = self._sort(idx_Nk)
        xs = x_ND.index_select(0, token)
        outs, start = [], 0
        for e, n in enumerate(counts.tolist()):  # one host sync per layer
            if n:
                outs.append(expert(e, xs[start : start + n]))
                start += n
        ys = torch.cat(outs) * w_Nk.flatten()[order, None].to(x_ND.dtype)
        return out.index_add_(0, token, ys)

    def routed_dense_loop(self, x_ND: torch.Tensor, w_Nk: torch.Tensor, idx_Nk: torch.Tensor) -> torch.Tensor:
        dense_w = torch.zeros(x_ND.shape[0], self.n_experts, dtype=w_Nk.dtype, device=x_ND.device)
        dense_w.scatter_(1, idx_Nk, w_Nk)
        out = torch.zeros_like(x_ND)
        for e, expert in enumerate(self.experts):
            out = out + dense_w[:, e : e + 1].to(x_ND.dtype) * expert(x_ND)
        return out
