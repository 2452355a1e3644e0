"""The one shim the engines' modules need on a CPU machine (imported first by the check_* scripts).

PyPI's torchvision is a CUDA build: beside the CPU torch its compiled ops cannot load, and its import then fails
registering fake kernels for `torchvision::nms` / `qnms`. sglang imports torchvision for image preprocessing that
no check here calls; defining those two op schemas (no kernel) lets the import finish. Nothing else is patched.
"""

import torch


def install() -> None:
    try:
        torch.ops.torchvision.nms  # noqa: B018 -- the real ops loaded (a CUDA machine): nothing to do
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    install.lib = lib  # kept alive: the definitions go with the Library object


install()
