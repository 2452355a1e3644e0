"""`glm5 finetune sft --qlora`: the model side of a LoRA run over a frozen base that no process loads whole
(finetune/sharded_load.py): the checks of the flag's combinations, the load, and the adapter's write."""

from __future__ import annotations

import json
from pathlib import Path

from glm5cli.common import EXIT_USAGE, console, fail


def check_flags(model: Path, full: bool, qat, merge: bool, train_mtp: bool) -> None:
    """What --qlora cannot combine with, as usage errors before anything is read."""
    from finetune.sharded_load import base_format
    from model.config import GLM5Config

    if full or qat is not None or train_mtp:
        fail("--qlora trains a LoRA adapter over the frozen base: not with --full, --qat or --train-mtp",
             code=EXIT_USAGE)  # fmt: skip
    if merge and base_format(GLM5Config.from_pretrained(model)) == "int4":
        fail("--merge needs full-precision weights; this base is INT4", code=EXIT_USAGE,
             hint=f"serve the adapter beside the INT4 weights: glm5 serve {model} --quant int4 --lora OUT/adapter")  # fmt: skip


def load(model: Path, rank: int, alpha: int, seed: int, dist):
    """-> (the model with LoRA, its trainable parameters); a checkpoint that does not fit is a failure."""
    from finetune.lora import LoraSettings
    from finetune.sharded_load import base_format, load_lora_sharded
    from model.checkpoint import CheckpointError
    from model.config import GLM5Config

    fmt = base_format(GLM5Config.from_pretrained(model))
    with console.status(f"loading {model} ({fmt} base, this rank's shards only)..."):
        try:
            return load_lora_sharded(model, LoraSettings(rank=rank, alpha=alpha), dist, seed=seed)
        except (CheckpointError, ValueError) as e:
            fail(str(e))


def write_adapter(model: Path, net, work: Path, merge: bool, dist) -> None:
    """OUT/adapter (peft's files) from the sharded adapter, rank 0 writing; with --merge the adapter is then
    merged into the base loaded whole on rank 0 (the one step that holds the full model). adapter_base.json
    records no weights fingerprint: the base was never whole here to hash (`glm5 serve --lora` skips the check
    for such an adapter) and says which format it was trained over."""
    from finetune.lora import BASE_FILE, save_adapter
    from finetune.sharded_load import base_format
    from model.config import GLM5Config

    state = dist.gather(net, trained_only=True) if dist is not None else None
    if dist is None or dist.is_main:
        if state is None:
            state = {n: p.detach() for n, p in net.named_parameters() if "lora_" in n}
        save_adapter(net, work / "adapter", base=str(model.resolve()), fingerprint="-", state=state)
        rec_file = work / "adapter" / BASE_FILE
        rec = json.loads(rec_file.read_text())
        fmt = base_format(GLM5Config.from_pretrained(model))
        rec |= {"weights_fingerprint": None, "trained_over": fmt}
        if fmt == "int4":  # `glm5 serve --lora` warns when it is served without --quant int4
            rec["quant"] = "int4"
        rec_file.write_text(json.dumps(rec, indent=1))
        if merge:
            from finetune.lora import load_adapter, merge_lora
            from glm5cli.finetune_cmd import _load_for_training, _write_checkpoint

            base = _load_for_training(model, "merge onto a full-precision checkpoint")
            _write_checkpoint(model, merge_lora(load_adapter(base, work / "adapter")), work)
    if dist is not None:
        dist.barrier()
