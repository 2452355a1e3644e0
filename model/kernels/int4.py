"""The INT4 linear's own CPU kernel (model/kernels/cpu_int4.c): y = x @ W^T with fp32 activations in and out and
group-wise symmetric int4 weights, repacked once at load into the layout the kernel reads.

Which CPU kernel an `Int4Linear` (model/int4_linear.py) runs is chosen per machine when the layer is built
(`cpu_kernel()`):
- "glm5" (this kernel) on CPUs whose best vector code is AVX2: there torch's `_weight_int4pack_mm_for_cpu`
  decodes every weight again for each block of <= 4 input rows and needs bf16 activations, and it was no faster
  than fp32 at `small`'s sizes; this kernel decodes each weight once per 4 rows, straight into fp32 registers
  (measured on an AVX2 EPYC Zen 3: benchmarks/RESULTS.md, INT4).
- "tinygemm" (torch's kernel) on AVX-512 CPUs, where its AVX-512 branch is what INT4 was tuned and measured on
  (1.8-2.0x fp32 at decode), for bf16 layers (torch's kernel is bf16-native), asymmetric weights, and wherever
  this kernel did not build or failed its probe.
`GLM5_INT4_CPU_KERNEL=glm5|tinygemm` overrides the choice (glm5 still only where it built and passed).

Unlike the other kernels of this package, this one is not bit-identical to its reference (`reference.int4_linear`,
dequantize then `F.linear`): the weights are the reference's bits, but the dot products are summed in another
order (FMA, column by column). Its probe therefore checks every output to within K * 2^-23 of |x| @ |W|^T, a
bound on the rounding of two fp32 sums of K products; a wrong nibble, scale or row is off by far more.

Shapes: B rows of input, N outputs, K inputs, G = K / group, Nb = N padded to a multiple of 16, over 16.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import threading

import torch
import torch.nn.functional as F

from model.kernels import build, reference

log = logging.getLogger(__name__)

BLOCK = 16  # outputs per block of the layout (two 8-float AVX2 vectors)
KERNELS = ("glm5", "tinygemm")
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURE = (_P, _I, _I, _I, _P, _P, _I, _I, _P, _P, _I)
_lock = threading.Lock()
_state: dict[str, object] = {}  # "fn": the probed kernel or None, "note": why not, "set_threads", "threads"


def load():
    """The kernel's ctypes function if it built here and passed its probe, else None (built once a process)."""
    if "fn" in _state:
        return _state["fn"]
    with _lock:
        if "fn" not in _state:
            fn, note = None, "turned off by GLM5_CPU_KERNELS=0"
            if os.environ.get("GLM5_CPU_KERNELS", "1") != "0":
                fn, note = _build_and_probe()
            _state.update(fn=fn, note=note)
            if fn is None:
                log.info("glm5 INT4 CPU kernel not used (%s); Int4Linear runs torch's int4 kernel", note)
    return _state["fn"]


def _build_and_probe():
    try:
        path = build._compile("int4")
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"could not compile cpu_int4.c: {build._why(e)}"
    if path is None:
        return None, "no C compiler"
    lib = ctypes.CDLL(str(path))
    lib.glm5_set_threads.argtypes, lib.glm5_set_threads.restype = (ctypes.c_int,), None
    fn = lib.glm5_int4_linear
    fn.argtypes, fn.restype = _SIGNATURE, ctypes.c_int
    _state.update(set_threads=lib.glm5_set_threads, threads=None)
    _sync_threads()
    try:
        with torch.inference_mode():
            ok = probe(fn, torch.Generator().manual_seed(0))
    except Exception as e:  # a probe must never break a load
        return None, f"its probe raised {e}"
    return (fn, "") if ok else (None, "it differs from the reference on this machine (or has no AVX2 / FMA)")


def _sync_threads() -> None:
    # As the other kernels: as many threads as torch uses, one under OMP_WAIT_POLICY=PASSIVE (build.PASSIVE).
    threads = 1 if build.PASSIVE else torch.get_num_threads()
    if threads != _state.get("threads"):
        _state["set_threads"](threads)  # type: ignore[operator]
        _state["threads"] = threads


def cpu_kernel(symmetric: bool = True, group_size: int = 128, dtype: torch.dtype = torch.float32) -> str:
    """Which CPU kernel a fast `Int4Linear` with these properties uses on this machine (see the module docstring)."""
    want = os.environ.get("GLM5_INT4_CPU_KERNEL", "").strip().lower()
    if want and want not in KERNELS:
        raise ValueError(f"GLM5_INT4_CPU_KERNEL must be one of {KERNELS}, got {want!r}")
    if not symmetric or group_size % 8 or dtype != torch.float32 or want == "tinygemm":
        return "tinygemm"
    if not want and torch.backends.cpu.get_cpu_capability() not in ("AVX2",):
        return "tinygemm"  # AVX-512 (torch's AVX-512 branch), or no vector code this kernel was measured on
    return "glm5" if load() is not None else "tinygemm"


def status() -> str:
    """One line for logs and benchmarks: the kernel a default fp32 INT4 layer runs here, and why."""
    kernel = cpu_kernel()
    why = _state.get("note") or f"cpu capability {torch.backends.cpu.get_cpu_capability()}"
    return f"int4 cpu kernel: {kernel} ({why})"


def repack(q_NK: torch.Tensor, scale_NG: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (w [Nb, K/8, 16] int32, s [Nb, G, 16] fp32): the kernel's layout (cpu_int4.c) of symmetric int4 `q`
    in [-8, 7] and its scales. Outputs past N are zero weights with zero scales."""
    n, k = q_NK.shape
    g = scale_NG.shape[1]
    if k % 8 or k % g or (k // g) % 8:
        raise ValueError(f"the INT4 CPU kernel needs K and the group size multiples of 8, got K={k}, G={g}")
    nb = -(-n // BLOCK)
    q = F.pad(q_NK.to(torch.int64) & 0xF, (0, 0, 0, nb * BLOCK - n)).view(nb, BLOCK, k // 8, 8)
    word = (q << (4 * torch.arange(8))).sum(-1)  # nibble i at bits 4i: [Nb, 16, K/8], in [0, 2^32)
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)  # the same 32 bits, as int32
    s = F.pad(scale_NG.float(), (0, 0, 0, nb * BLOCK - n)).view(nb, BLOCK, g)
    return word.transpose(1, 2).contiguous(), s.transpose(1, 2).contiguous()


def linear(
    x_BK: torch.Tensor, w: torch.Tensor, s: torch.Tensor, n: int, group: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """y [B, N] = x [B, K] @ W^T (+ bias) with the kernel; x fp32 on the CPU with unit stride along K, `w` and `s`
    from `repack` (N outputs, `group` inputs a scale). Call only where `load()` returned the kernel."""
    _sync_threads()
    if x_BK.stride(1) != 1:
        x_BK = x_BK.contiguous()
    y = torch.empty(x_BK.shape[0], n)
    r = _state["fn"](  # type: ignore[operator]
        x_BK.data_ptr(), x_BK.stride(0), x_BK.shape[0], x_BK.shape[1], w.data_ptr(), s.data_ptr(), n, group,
        None if bias is None else bias.data_ptr(), y.data_ptr(), n,
    )  # fmt: skip
    if r:
        raise RuntimeError(f"glm5_int4_linear rejected x {tuple(x_BK.shape)} with N={n}, group={group}")
    return y


def tolerance(x_BK: torch.Tensor, w_NK: torch.Tensor) -> torch.Tensor:
    """[B, N]: how far an fp32 dot product of x's rows with W's may be from another summation order of it."""
    return (x_BK.abs() @ w_NK.abs().t()) * (x_BK.shape[1] * 2.0**-23) + torch.finfo(torch.float32).tiny


def probe(fn, g: torch.Generator) -> bool:
    """The kernel against `reference.int4_linear` at decode's and prefill's row counts (1..16 and a block tail),
    the group sizes, N not a multiple of 16, rows of a wider tensor, a bias, and scales from 1e-3 to 1e3."""
    ok = True
    for n, k, group in ((256, 768, 128), (40, 256, 32), (16, 512, 64), (24, 256, 256)):
        q = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
        s_NG = 10.0 ** (torch.rand(n, k // group, generator=g) * 6 - 3)  # scales from 1e-3 to 1e3
        w, s = repack(q, s_NG)
        dense = (q.float().view(n, -1, group) * s_NG.unsqueeze(-1)).view(n, k)
        for rows in (1, 2, 3, 4, 5, 16):
            x = torch.randn(rows, k + 3, generator=g)[:, :k]  # rows k + 3 floats apart
            bias = torch.randn(n, generator=g) if rows == 3 else None
            y = torch.full((rows, n), float("nan"))
            r = fn(x.data_ptr(), x.stride(0), rows, k, w.data_ptr(), s.data_ptr(), n, group,
                   None if bias is None else bias.data_ptr(), y.data_ptr(), n)  # fmt: skip
            want = reference.int4_linear(x, q, s_NG, bias)
            tol = tolerance(x, dense) + (0 if bias is None else bias.abs() * 2.0**-23)
            ok &= r == 0 and bool(((y - want).abs() <= tol).all())
    return ok
