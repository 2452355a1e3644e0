"""Building, loading and checking the fused CPU kernels (model/kernels/cpu_kernels.c, cpu_kernels_vec.cpp).

Each source is compiled by the system's compiler (`$CC` / `$CXX`, else `cc` / `c++`) for this CPU into a cache
directory (`$GLM5_KERNEL_CACHE`, else `~/.cache/glm5/kernels`) under a name that hashes the source, the command,
torch's version and the CPU, and loaded with ctypes (which releases the GIL during a call). Before a kernel is
used, its probe (model/kernels/probes.py) runs it and its reference on random inputs; a kernel that differs in
any bit is never used, and the loader logs which. Either source may fail to build; `GLM5_CPU_KERNELS=0` turns
both off. Nothing here raises: without kernels every op runs its reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from model.kernels.probes import PROBES

log = logging.getLogger(__name__)

_SRC = Path(__file__).with_name("cpu_kernels.c")
_SRC_VEC = Path(__file__).with_name("cpu_kernels_vec.cpp")
# The INT4 linear (model/kernels/int4.py loads it on its own, when an INT4 model is built): plain C with AVX2 /
# FMA intrinsics, checked to a tolerance rather than bit for bit, so it is not one of the ops' kernels here.
_SRC_INT4 = Path(__file__).with_name("cpu_int4.c")
_SOURCES = {"c": _SRC, "cpp": _SRC_VEC, "int4": _SRC_INT4}
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")
# torch's CPU sum reads rows as vectors of this many floats (8 measured for torch 2.x on x86-64, AVX2 and
# AVX-512 builds alike); if the probe finds otherwise, the other width is tried.
_SUM_LANES = (8, 16)
# With OMP_WAIT_POLICY=PASSIVE, OpenMP's threads sleep between parallel regions and waking them costs ~0.1 ms a
# call (measured: a 512 x 768 RMSNorm on 2 threads takes 0.18 ms that way, 0.15 ms on one, 0.08 ms with the
# default policy), more than splitting one of these passes saves: the kernels then run on the calling thread.
PASSIVE = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
# torch's at::internal::GRAIN_SIZE: element-wise kernels on more values than this are split between threads.
GRAIN = 32768

_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float
_SIGNATURES = {
    "glm5_rms_norm": (_P, _I, _P, _P, _I, _I, _F),
    "glm5_add_rms_norm": (_P, _P, _P, _P, _P, _I, _I, _F),
    "glm5_rope": (_P, _I, _I, _P, _P, _P, _I, _I, _I, _I, _I, _I),
    "glm5_attn_bias": (_P, _I, _P, _I, _I, _P),
    "glm5_concat_heads": (_P, _I, _I, _I, _P, _I, _I, _I, _P, _I, _I, ctypes.c_int, _F),
    "glm5_mul_rows": (_P, _I, _P, _I, _P, _I, _I),
    "glm5_topk_set": (_P, _I, _I, _I, _I, _P, _P),
    "glm5_softmax_bias": (_P, _P, _I, _I, _I),
    "glm5_silu_mul": (_P, _I, _P, _I, _P, _I, _I),
    "glm5_moe_experts": (_P, _I, _P, _P, _P, _I, _P, _P, _I, _I, _P, _I, _P, _I, _I),
    "glm5_attend_heads": (_P, _I, _I, _P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _I, _I, _I, _I, _P),
    "glm5_index_scores": (_P, _I, _P, _I, _P, _P, _I, _I, _I, _I, _I, _P),
}
# Which source each kernel is in: plain C, or C++ on torch's vector math (the ones that call exp, and the MoE
# experts, which also call torch's BLAS).
_CPP = ("glm5_softmax_bias", "glm5_silu_mul", "glm5_moe_experts", "glm5_attend_heads", "glm5_index_scores")
_SOURCE_OF = {name: "cpp" if name in _CPP else "c" for name in _SIGNATURES}
_RESTYPES = {
    "glm5_topk_set": ctypes.c_int64,
    "glm5_moe_experts": ctypes.c_int,
    "glm5_attend_heads": ctypes.c_int,
    "glm5_index_scores": ctypes.c_int,
}

_lock = threading.Lock()
_state: dict[str, object] = {}  # "fns": {name: function} | None, "enabled": names that passed the probe, "note"


def load() -> dict | None:
    """{kernel name: function} of everything built (the probe's verdicts are in _state["enabled"]), or None."""
    if "fns" in _state:
        return _state["fns"]  # type: ignore[return-value]
    with _lock:
        if "fns" not in _state:
            fns, enabled, note = None, set(), "turned off by GLM5_CPU_KERNELS=0"
            if os.environ.get("GLM5_CPU_KERNELS", "1") != "0":
                fns, enabled, note = _build_and_probe()
            _state.update(enabled=enabled, note=note)
            _state["fns"] = fns
    return _state["fns"]  # type: ignore[return-value]


def _bind(path: Path, names) -> dict:
    lib = ctypes.CDLL(str(path))
    lib.glm5_set_threads.argtypes, lib.glm5_set_threads.restype = (ctypes.c_int,), None
    lib.glm5_set_threads(1)  # the probe runs single-threaded; `_kernel` sets torch's count before any use
    _state.setdefault("set_threads", []).append(lib.glm5_set_threads)
    _state["threads"] = None
    fns = {}
    for name in names:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = _SIGNATURES[name], _RESTYPES.get(name)
        fns[name] = fn
    return fns


def _build_and_probe() -> tuple[dict | None, set[str], str]:
    """Builds and checks the C kernels, then the C++ ones (they are independent: either may be missing)."""
    fns: dict = {}
    enabled: set[str] = set()
    notes = []
    c_names = [n for n, src in _SOURCE_OF.items() if src == "c"]
    note = "no C compiler"
    for lanes in _SUM_LANES:
        try:
            path = _compile("c", f"-DSUM_LANES={lanes}")
        except (OSError, subprocess.SubprocessError) as e:
            note = f"could not compile {_SRC.name}: {_why(e)}"
            break
        if path is None:
            break
        built = _bind(path, c_names)
        ok = _probe(built)
        if ok:
            fns.update(built)
            enabled |= ok
            note = f"{lanes}-float sums"
            break
        note = f"{_SRC.name} differs from torch on this machine"
    notes.append(note)
    cpp_names = [n for n, src in _SOURCE_OF.items() if src == "cpp"]
    try:
        path = _compile("cpp")
        note = "no C++ compiler" if path is None else ""
        if path is not None:
            built = _bind(path, cpp_names)
            ok = _probe(built)
            fns.update(built)
            enabled |= ok
            note = "" if ok else f"{_SRC_VEC.name} differs from torch on this machine"
    except (OSError, subprocess.SubprocessError) as e:
        note = f"could not compile {_SRC_VEC.name}: {_why(e)}"
    if note:
        notes.append(note)
    if not enabled:
        log.info("glm5 CPU kernels not used (%s); running the torch reference", "; ".join(notes))
        return None, set(), "; ".join(notes)
    rejected = sorted(n.removeprefix("glm5_") for n in fns if n not in enabled)
    if rejected:  # a probe that fails is not an error: that op runs its reference here, with the same result
        log.info("glm5 CPU kernels that differ from torch on this machine, not used: %s", ", ".join(rejected))
        notes.append("differ here: " + ", ".join(rejected))
    return fns, enabled, "; ".join(notes)


def _why(e: Exception) -> str:
    err = getattr(e, "stderr", None)
    first = err.decode(errors="replace").strip().splitlines()[:1] if isinstance(err, bytes) else []
    return first[0] if first else str(e)


def _cache_dir() -> Path:
    base = os.environ.get("GLM5_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "glm5", "kernels"
    )
    path = Path(base)
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.gettempdir())


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
    except OSError:
        return platform.machine() + platform.processor()


def _command(kind: str, *defines: str) -> list[str] | None:
    """The compile command for one source, without its output path; None without a compiler."""
    if kind in ("c", "int4"):
        cc = shutil.which(os.environ.get("CC", "cc"))
        return None if cc is None else [cc, *_FLAGS, *defines, str(_SOURCES[kind]), "-lm"]
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        return None
    root = Path(torch.__file__).parent
    capability = torch.backends.cpu.get_cpu_capability()  # the vector code torch's own kernels run here
    cap = [f"-DCPU_CAPABILITY_{capability}", f"-DCPU_CAPABILITY={capability}"] if capability != "DEFAULT" else []
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"
    return [
        cxx, "-std=c++17", *_FLAGS, *cap, abi, "-I", str(root / "include"), str(_SRC_VEC),
        "-L", str(root / "lib"), "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{root / 'lib'}",
    ]  # fmt: skip


def _compile(kind: str, *defines: str) -> Path | None:
    """The shared library for this source, command and CPU: from the cache, or built now (C ~0.5 s, C++ ~3 s)."""
    cmd = _command(kind, *defines)
    if cmd is None:
        return None
    src = _SOURCES[kind].read_bytes()
    key = hashlib.sha256(b"\0".join([src, " ".join(cmd).encode(), torch.__version__.encode(), _cpu_id().encode()]))
    out = _cache_dir() / f"glm5_cpu_kernels_{kind}_{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([*cmd, "-o", tmp], check=True, capture_output=True, timeout=300)
        os.replace(tmp, out)  # atomic: a concurrent build of the same key writes the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


# Kernels whose references are BLAS calls that torch may split between threads: probed on one thread and on
# several, since those may round otherwise (they do for attend_heads on an AVX2 EPYC) and the thread count can
# change after loading. (The MoE probe checks its BLAS on both itself.)
_BLAS_PROBED = ("glm5_attend_heads", "glm5_index_scores")


def _probe(fns: dict) -> set[str]:
    """The kernels (of those in `fns`) whose output equals their reference bit for bit on random inputs of
    several shapes, strides and scales (model/kernels/probes.py). A probe that raises rejects its kernel;
    nothing propagates."""
    before = torch.get_num_threads()
    passed = set()
    with torch.inference_mode():
        for name, fn in fns.items():
            try:
                ok = True
                for threads in sorted({1, 2, before}) if name in _BLAS_PROBED else [before]:
                    torch.set_num_threads(threads)
                    ok = ok and PROBES[name](fn, torch.Generator().manual_seed(0))
            except Exception as e:  # a probe must never break a load: the reference runs instead
                log.info("glm5 CPU kernel %s: its probe raised %s: not used", name, e)
                ok = False
            finally:
                torch.set_num_threads(before)
            if ok:
                passed.add(name)
    return passed


def kernel(name: str):
    """The kernel's function if it is built and passed its probe, else None."""
    fns = load()
    if fns is None or name not in _state["enabled"]:
        return None
    threads = torch.get_num_threads() if not PASSIVE else 1
    if threads != _state.get("threads"):  # the kernels split rows over as many threads as torch uses
        for set_threads in _state["set_threads"]:
            set_threads(threads)
        _state["threads"] = threads
    return fns.get(name)


def status() -> str:
    """One line for logs and benchmarks: which kernels are in use, or why none."""
    if load() is None:
        return f"cpu kernels: off ({_state.get('note', 'unavailable')})"
    on = sorted(_state["enabled"])
    return f"cpu kernels: {', '.join(k.removeprefix('glm5_') for k in on) or 'none'} ({_state.get('note', '')})"
