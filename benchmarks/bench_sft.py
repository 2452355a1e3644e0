"""SFT benchmarks: our LoRA SFT's tokens/s against TRL's SFTTrainer + peft on the same model, config and data
(when trl is installed: `pip install trl`; it is not a dependency of glm5), and the peak memory of full
fine-tuning against the parameter count's bound. Writes benchmarks/bench_sft.json.

    .venv/bin/python benchmarks/bench_sft.py [--preset tiny] [--steps 8] [--seqs 32] [--len 256]

Both sides: the same checkpoint (ours written by `save_pretrained`, read by transformers as
GlmMoeDsaForCausalLM), LoRA rank 16 / alpha 32 on the attention and MLP linears (routed experts included:
peft's `target_parameters` for transformers' fused experts), AdamW at the same learning rate, batch 4, the same
pre-tokenized sequences and target masks, fp32 on CPU. Timed: the steps after the first (warm-up), wall clock;
tokens are the real (unpadded) tokens of the sequences trained on.

Full fine-tuning's bound: 16 bytes per parameter (fp32 weights, gradients, and AdamW's two moments), plus
activations; the measured peak is the process's maximum RSS growth over the loaded model (a subprocess each).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).absolute().parents[1]))

TARGETS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_checkpoint(preset: str, dest: Path) -> Path:
    from model import GLM5ForCausalLM
    from model.config import preset as get_preset
    from model.tokenizer import save_tokenizer_files

    cfg = get_preset(preset)
    GLM5ForCausalLM.from_config(cfg, seed=0).save_pretrained(dest)
    save_tokenizer_files(dest)
    return dest


def make_data(n: int, length: int, vocab: int, seed: int = 0) -> list[tuple[list[int], list[bool]]]:
    """Sequences of about `length` tokens, the second half of each a target (an assistant turn)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = int(length * (0.75 + 0.5 * torch.rand((), generator=g)))
        ids = torch.randint(0, vocab - 200, (t,), generator=g).tolist()
        out.append((ids, [i >= t // 2 for i in range(t)]))
    return out


def ours(ckpt: Path, data, steps: int, batch: int, lr: float) -> dict:
    from finetune.lora import LoraSettings, add_lora
    from finetune.sft import SFTConfig, train_sft
    from model import GLM5ForCausalLM

    net = add_lora(GLM5ForCausalLM.from_pretrained(ckpt, dtype=torch.float32), LoraSettings(rank=16, alpha=32))
    times: list[float] = []
    train_sft(
        net, data, SFTConfig(steps=steps, lr=lr, warmup=1, batch_size=batch), on_step=lambda i: times.append(i.seconds)
    )
    return {"step_s": times[1:]}


def trl_side(ckpt: Path, data, steps: int, batch: int, lr: float) -> dict | None:
    try:
        import trl
    except ImportError:
        return None
    import peft
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    lora = peft.LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=list(TARGETS),  # the shared expert's and the dense MLP's linears are modules
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    ds = Dataset.from_list([{"input_ids": s, "completion_mask": [int(x) for x in m]} for s, m in data])
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        cfg = trl.SFTConfig(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=batch,
            learning_rate=lr,
            lr_scheduler_type="cosine",
            warmup_steps=1,
            logging_steps=steps,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            completion_only_loss=True,  # the pre-tokenized `completion_mask` column marks the targets
            max_length=None,
            dataloader_num_workers=0,
            gradient_checkpointing=False,  # TRL turns it on by default; ours does not recompute activations
        )
        trainer = trl.SFTTrainer(model=model, args=cfg, train_dataset=ds, peft_config=lora, callbacks=[Clock()])
        t0 = time.perf_counter()
        trainer.train()
    starts = [t0, *marks[:-1]]
    return {"step_s": [b - a for a, b in zip(starts, marks, strict=True)][1:], "trl": trl.__version__}


def full_memory(ckpt: Path, data_path: Path, steps: int) -> dict:
    """Peak RSS of a few full fine-tuning steps, in a fresh process, against 16 bytes per parameter."""
    code = f"""
import json, resource, torch, sys
sys.path.insert(0, {str(Path(__file__).absolute().parents[1])!r})
from model import GLM5ForCausalLM
from finetune.full import prepare_full
from finetune.sft import SFTConfig, train_sft
net = GLM5ForCausalLM.from_pretrained({str(ckpt)!r}, dtype=torch.float32)
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
named = prepare_full(net)
data = [tuple(x) for x in json.load(open({str(data_path)!r}))]
train_sft(net, data, SFTConfig(steps={steps}, lr=1e-5, warmup=1, batch_size=4), named=named)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = sum(p.numel() for p in net.parameters())
t = sum(p.numel() for _, p in named)
print(json.dumps({{"params": n, "trained": t, "loaded_kib": loaded, "peak_kib": peak}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    bound = d["params"] * 4 + d["trained"] * 12  # weights + (grads + 2 moments) of the trained ones
    growth = (d["peak_kib"] - d["loaded_kib"]) * 1024
    return {**d, "bound_bytes": bound, "peak_over_weights_bytes": growth + d["params"] * 4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--out", default=str(Path(__file__).parent / "bench_sft.json"))
    a = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_checkpoint(a.preset, Path(tmp) / "ckpt")
        data = make_data(a.seqs, a.len, 8192 if a.preset == "tiny" else 150000)
        real_tokens_per_step = 4 * sum(len(s) for s, _ in data) / len(data)
        res: dict = {"preset": a.preset, "steps": a.steps, "batch": 4, "tokens_per_step": real_tokens_per_step}
        o = ours(ckpt, data, a.steps, 4, 2e-4)
        res["ours_tokens_per_s"] = real_tokens_per_step * len(o["step_s"]) / sum(o["step_s"])
        t = trl_side(ckpt, data, a.steps, 4, 2e-4)
        if t is not None:
            res["trl_tokens_per_s"] = real_tokens_per_step * len(t["step_s"]) / sum(t["step_s"])
            res["ours_over_trl"] = res["ours_tokens_per_s"] / res["trl_tokens_per_s"]
            res["trl_version"] = t["trl"]
        dp = Path(tmp) / "data.json"
        dp.write_text(json.dumps(data))
        res["full_ft_memory"] = full_memory(ckpt, dp, 3)
    res["cpu_threads"] = torch.get_num_threads()
    res["max_rss_kib_parent"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
