"""The plain-PyTorch reference of every fused CPU kernel: what each kernel must equal, bit for bit (the loader's
probes check it before a kernel is used), and what runs wherever a kernel does not apply. Inference-path
arithmetic: several functions work in place on a tensor their caller owns (named in each docstring).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm's inference path in torch ops (fp32 math, cast back before the scale)."""
    x32 = x.float()
    y = x32 * x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    return y.to(x.dtype).mul_(weight)


def add_rms_norm(
    a: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum into `a` (in place) and the RMSNorm of it."""
    s = a.add_(h)
    return s, rms_norm(s, weight, eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair RoPE on x's last dim, output de-interleaved (model/rope.py's `apply_rope`)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attn_bias(
    topk: torch.Tensor | None, q_idx: torch.Tensor, s_end: int, n_keys: int | None = None, dtype=torch.float32
) -> torch.Tensor:
    """Additive mask [..., t, s_end] of a block of queries (model/attention.py, `attend_expanded`): 0 where key
    s <= q_idx[..., t] (and s is among topk[..., t, :] when given), else -inf. q_idx [t] or [B, t]; topk
    [..., t, K] with every index below n_keys (default: found from topk)."""
    future = torch.arange(s_end, device=q_idx.device) > q_idx[..., None]
    if topk is None:
        return torch.zeros(future.shape, dtype=dtype, device=q_idx.device).masked_fill_(future, float("-inf"))
    width = max(s_end, n_keys if n_keys is not None else int(topk.max()) + 1)
    bias = torch.full((*topk.shape[:-1], width), float("-inf"), dtype=dtype, device=q_idx.device)
    return bias.scatter_(-1, topk, 0.0)[..., :s_end].masked_fill_(future, float("-inf"))


def concat_heads(a: torch.Tensor, b: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """[a | b] along the last dim (b broadcast to a's leading shape), times `scale` if given."""
    out = torch.cat([a, b.expand(*a.shape[:-1], b.shape[-1])], dim=-1)
    return out if scale is None else out.mul_(scale)


def mul_rows(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """x *= u, then x *= w (one weight per row), in place."""
    x = x.mul_(u)
    return x if w is None else x.mul_(w[:, None])


def softmax_bias(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(x + bias) over the last dim, x updated in place by the sum (attention's masked softmax)."""
    return x.add_(bias).softmax(-1)


def silu_mul(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's activation in place: x = silu(x) * u (* w, one weight per row)."""
    return mul_rows(F.silu(x, inplace=True), u, w)


def attend_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Masked attention of t queries over s keys, every head (model/attention.py, `attend_expanded` with one
    sequence): q [t, H, d], k [s, H, d], v [s, H, dv], bias [t, s] (0 / -inf, shared by the heads) ->
    out [t, H, dv] (written in place) = softmax(q_h k_h^T + bias) v_h per head."""
    scores = torch.bmm(q.transpose(0, 1), k.permute(1, 2, 0))  # [H, t, s]
    return torch.bmm(softmax_bias(scores, bias), v.transpose(0, 1), out=out.transpose(0, 1)).transpose(0, 1)


def attend(q, k, v, bias, out, softmax_bias=softmax_bias) -> torch.Tensor:
    """Masked attention of a query block (model/kernels/ops.py, `attend`): q [B, t, H, d], k [B, s, H, d],
    v [B, s, H, dv], bias [t, s] or [B, t, s] -> out [B, t, H, dv], written in place. One batched GEMM over the
    (sequence, head) pairs for the scores, the masked softmax (`softmax_bias`, in place), one for the values."""
    B, t, H, _ = q.shape
    s = k.shape[1]
    scores = torch.bmm(q.transpose(1, 2).flatten(0, 1), k.permute(0, 2, 3, 1).flatten(0, 1))  # [B*H, t, s]
    if bias.dim() == 3 and B > 1:  # each sequence's mask, repeated per head ([t, s] or [1, t, s] broadcast)
        bias = bias[:, None].expand(B, H, t, s).flatten(0, 1)
    probs = softmax_bias(scores, bias)
    v = v.transpose(1, 2).flatten(0, 1)  # [B*H, s, dv]
    if B == 1 and not torch.is_grad_enabled():  # straight into out's [t, H, dv] rows: no copy, the same bits
        torch.bmm(probs, v, out=out[0].transpose(0, 1))
    else:
        out.copy_(torch.bmm(probs, v).unflatten(0, (B, H)).transpose(1, 2))
    return out


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The DSA indexer's scores (model/indexer.py, `Indexer.scores`, scale folded into w): q [B, T, I, d] queries,
    k [B, S, d] keys, w [B, T, I] head weights -> [B, T, S] = sum_i w[b, t, i] * relu(q[b, t, i] . k[b, s]).
    One GEMM over all (query, head) rows, then in place."""
    B, T, I, d = q.shape
    logits = torch.bmm(q.reshape(B, T * I, d), k.transpose(1, 2)).relu_()
    return torch.matmul(w[:, :, None, :], logits.view(B, T, I, -1)).squeeze(2)


def moe_experts(
    x: torch.Tensor,
    token: torch.Tensor,
    w: torch.Tensor,
    counts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    out: torch.Tensor,
    swiglu=silu_mul,
) -> torch.Tensor:
    """The routed experts of a MoE layer over (token, expert) pairs sorted by expert (model/moe.py,
    `MoE.routed_stacked`): pair p is row token[p] of x [N, D] with routing weight w[p]; expert e owns the next
    counts[e] pairs; gate_up [E, D, 2I] and down [E, I, D] are the experts' stacked weights (input-major).
    out [N, D] += sum over pairs of w[p] * down_e(silu(gate_e(x)) * up_e(x)), in place, in pair order.
    `swiglu(g, u, w)` computes the activation (any function with silu_mul's bits; the model's runs in place
    on g when nothing trains)."""
    offs = counts.cumsum(0).to(torch.int32)
    h = torch._grouped_mm(x.index_select(0, token), gate_up, offs=offs)  # [pairs, 2I]
    g, u = h.split(down.shape[1], dim=-1)
    return out.index_add_(0, token, torch._grouped_mm(swiglu(g, u, w), down, offs=offs))


def int4_linear(
    x: torch.Tensor, q_NK: torch.Tensor, scale_NG: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """A symmetric group-wise INT4 linear (model/kernels/int4.py): dequantize `w = q * scale` in fp32, then
    `F.linear`. The INT4 kernel's weights are these bits; its sums agree to a tolerance, not bit for bit."""
    n, k = q_NK.shape
    w = (q_NK.float().view(n, scale_NG.shape[1], -1) * scale_NG.float().unsqueeze(-1)).view(n, k)
    return F.linear(x, w, bias)
