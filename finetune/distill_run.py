"""What `glm5 finetune distill` runs on: teachers by domain, prompts by domain, and the run's step log.

    teachers = parse_teachers(["math=runs/stage-a", "base"])    # {"math": Path, "default": None (the base)}
    prompts = read_prompts([("math", Path("math.jsonl"))], tokenizer)
    models = {d: load_teacher(p) for d, p in teachers.items() if p is not None}

A teacher is a checkpoint directory, a LoRA adapter directory (`glm5 finetune sft`'s OUT/adapter: merged into
the base checkpoint it recorded) or `base` (the student with its adapter off: no model is loaded). Prompt files
are the JSONL that align-mtp and `glm5 finetune rl --tasks` read ({"prompt"} or {"messages"} a line; a task's
"reward" is ignored here: the teacher is the signal); a line's "domain" key overrides its file's. Knows nothing
of the command line: errors are ValueError with the file (and line) in the message.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.distill import Prompt
from finetune.run_dir import write_atomic

BASE = "base"  # the teacher that is the student's own base (its LoRA adapter off)
DEFAULT_DOMAIN = "default"


def split_domain(spec: str) -> tuple[str, str]:
    """`DOMAIN=VALUE` -> (DOMAIN, VALUE); a plain `VALUE` is the default domain's. A path that itself holds '='
    can be given as `default=PATH`."""
    domain, sep, value = spec.partition("=")
    if not sep:
        return DEFAULT_DOMAIN, spec
    if not domain or not value:
        raise ValueError(f"{spec!r}: expected DOMAIN=VALUE or VALUE")
    return domain, value


def parse_teachers(specs: list[str]) -> dict[str, Path | None]:
    """`[DOMAIN=]CHECKPOINT|ADAPTER|base` each -> {domain: path, or None for the base}. One teacher a domain."""
    out: dict[str, Path | None] = {}
    for spec in specs:
        domain, value = split_domain(spec)
        if domain in out:
            raise ValueError(f"two teachers for domain {domain!r}: give each domain one --teacher")
        if value == BASE:
            out[domain] = None
            continue
        path = Path(value)
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ValueError(f"teacher {value}: not a checkpoint (no config.json) nor a LoRA adapter directory")
        out[domain] = path
    return out


def read_prompts(files: list[tuple[str, Path]], tokenizer) -> list[Prompt]:
    """(domain, JSONL path) pairs -> one Prompt a line, in file order; a line's "domain" overrides its file's."""
    from finetune.data.prompts import read_prompt_rows

    prompts = []
    for domain, path in files:
        try:
            rows = read_prompt_rows(path, tokenizer)
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
        for ids, row, where in rows:
            d = row.get("domain", domain)
            if not isinstance(d, str) or not d:
                raise ValueError(f'{where}: "domain" must be a non-empty string')
            prompts.append(Prompt(ids, d))
    return prompts


def check_domains(prompts: list[Prompt], teachers: dict[str, Path | None]) -> None:
    """Every prompt's domain has a teacher and every teacher has prompts (an unused one is most likely a typo)."""
    have = {p.domain for p in prompts}
    if missing := sorted(have - set(teachers)):
        raise ValueError(
            f"no teacher for the prompts of domain(s) {missing}: add --teacher DOMAIN=CKPT (or DOMAIN=base) for each"
        )
    if unused := sorted(set(teachers) - have):
        raise ValueError(f"no prompts for the teacher(s) of domain(s) {unused} (prompt domains: {sorted(have)})")


def load_teacher(path: Path, student_config):
    """A teacher checkpoint (or adapter, merged into the base it recorded), frozen, in fp32. Its vocabulary must
    be the student's: the teacher scores the student's token ids."""
    import torch

    from finetune.lora import load_adapter, merge_lora
    from model import GLM5ForCausalLM

    adapter = None
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        adapter = path
        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise ValueError(f"teacher {path}: the adapter's base checkpoint {base!r} is not there")
        path = Path(base)
    net = GLM5ForCausalLM.from_pretrained(path, dtype=torch.float32)
    if (net.config.quantization_config or {}).get("quant_method") == "compressed-tensors":
        raise ValueError(f"teacher {path} holds INT4 weights: give its full-precision checkpoint")
    if adapter is not None:
        net = merge_lora(load_adapter(net, adapter))
    if net.config.vocab_size != student_config.vocab_size:
        raise ValueError(
            f"teacher {adapter or path} has a vocabulary of {net.config.vocab_size} tokens, the student "
            f"{student_config.vocab_size}: a teacher must share the student's tokenizer"
        )
    return net


class StepLog:
    """OUT/train_log.jsonl: one line per step (step, reverse KL estimate, lr, tokens, seconds). A resumed run
    first drops the lines past its checkpoint, so the log is the run's, not the interrupted run's plus."""

    def __init__(self, path: Path, resume_step: int = 0):
        self.path = path
        lines = path.read_text().splitlines() if path.is_file() and resume_step else []
        kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= resume_step]
        write_atomic(path, "".join(ln + "\n" for ln in kept))

    def write(self, info) -> None:
        row = {"step": info.step, "reverse_kl": round(info.loss.lm, 5), "lr": info.lr, "tokens": info.loss.tokens}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row | {"seconds": round(info.seconds, 3)}) + "\n")
