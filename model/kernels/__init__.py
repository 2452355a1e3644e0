"""Fused CPU kernels for the network's inference passes, each behind one op with a plain-PyTorch reference.

A prefill on CPU spends most of its time in GEMMs, and much of the rest in element-wise passes that torch runs
one operation at a time, each reading the tensor and writing a fresh one: RMSNorm is five such passes. The
kernels do the same arithmetic in one or two passes, and three reorder GEMM work so that intermediates stay in
cache, calling the very sgemm torch calls (MKL's, inside libtorch_cpu) with the same arguments:
`moe_experts` (a MoE layer's routed experts, one expert's rows at a time), `attend` (a query block's attention
head by head) and `index_scores` (the DSA indexer's scores a block of queries at a time). Every kernel gives
its reference's bits; the loader checks that on this machine before using it, so a forward is the same
function of its inputs with or without them, and a machine without a compiler, or where torch sums in another
order (another CPU, another BLAS build), runs the reference for that op, logged once.

Module map, one way (each imports only those above it):
- reference.py   the plain-PyTorch reference of every op: what each kernel must equal, bit for bit
- probes.py      the loader's check of each kernel against its reference on random inputs
- build.py       compile (cc / c++, cached per source, torch version and CPU), load with ctypes, probe; status()
- fused.py       each kernel's Python side: runs it where it applies, else returns None
- ops.py         the ops the network calls, each with its one choice `impl="torch" | "fused"` (default fused;
                 `set_impl` / `use` for the process), reference wherever the kernel does not apply
- cpu_kernels.c  plain C: norms, RoPE, masks, copies, top-k
- cpu_kernels_vec.cpp  on torch's Vectorized types and BLAS: the softmax, SwiGLU's SiLU, the three GEMM ones
- int4.py        apart from the ops: Int4Linear's own CPU kernel (model/int4_linear.py) with its layout, probe and
                 per-machine choice against torch's int4 kernel; equal to its reference to a tolerance, not bits
- cpu_int4.c     that kernel: AVX2 / FMA, fp32 activations, int4 weights decoded once per 4 input rows

Life of a call: `kernels.rms_norm(x, w, eps)` -> ops: impl fused? -> fused.rms_norm: CPU fp32, no autograd,
a layout it takes, build.kernel("glm5_rms_norm") built and probed? -> the C function; any "no" -> reference.
"""

from model.kernels.build import status
from model.kernels.ops import (
    IMPLS,
    add_rms_norm,
    attend,
    attn_bias,
    concat_heads,
    fused_on,
    index_scores,
    moe_experts,
    mul_rows,
    rms_norm,
    rope,
    set_impl,
    silu_mul,
    softmax_bias,
    topk_indices,
    use,
)

__all__ = [
    "IMPLS",
    "add_rms_norm",
    "attend",
    "attn_bias",
    "concat_heads",
    "fused_on",
    "index_scores",
    "moe_experts",
    "mul_rows",
    "rms_norm",
    "rope",
    "set_impl",
    "silu_mul",
    "softmax_bias",
    "status",
    "topk_indices",
    "use",
]
