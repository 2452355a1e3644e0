"""SFT benchmarks: our LoRA SFT's tokens/s against TRL's SFTTrainer + peft on the same model, config and data
(when trl is installed: `pip install trl`; it is not a dependency of glm5), and the peak memory of full
fine-tuning against the parameter count's bound. Writes benchmarks/bench_sft.json.

    .venv/bin/python benchmarks/bench_sft.py [--preset tiny] [--steps 8] [--seqs 32] [--len 256] [--rounds 2]
        [--threads N] [--mem-preset small] [--mem-steps 3]

Both sides: the same checkpoint (ours written by `save_pretrained`, read by transformers as
GlmMoeDsaForCausalLM), LoRA rank 16 / alpha 32 on every linear of attention and MLPs, routed experts, shared
experts and the dense MLP included (TRL's side: the layout of finetune/lora_hf.py, the same deltas), AdamW at
the same learning rate, batch 4, the same pre-tokenized sequences and target masks, fp32 on CPU, the same torch
threads. Timed: the steps after the first (warm-up), wall clock, each side's median step; tokens are the real
(unpadded) tokens of the sequences trained on. The sides alternate (`--rounds`), the ratio is the median of the
rounds' ratios. On a shared, oversubscribed machine two OpenMP threads per process spend most of a step waiting
for each other (both sides ~40x slower than with one thread at load 17 on 2 cores): `--threads 1` measures the
code rather than the scheduler.

Full fine-tuning's bound: 16 bytes per parameter (fp32 weights, gradients, and AdamW's two moments), plus
activations; see `full_memory` for what is measured.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

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
        ids = torch.randint(0, vocab - 200, (t,), generator=g).tolist()  # below the special tokens
        out.append((ids, [i >= t // 2 for i in range(t)]))
    return out


def trl_lora_config(model, rank: int, alpha: int):
    """peft's LoRA for transformers' GlmMoeDsaForCausalLM with the same deltas as ours (finetune/lora_hf.py): the
    attention projections as modules; the fused routed experts (gate_up at rank 2r with alpha 2a: per-expert gate
    and up LoRA of rank r each), the dense MLPs' and shared experts' linears as `target_parameters` (with
    transformers v5, peft maps any `target_modules` named gate/up/down_proj onto the fused experts only, which
    left the shared experts and the dense MLP without LoRA in the 0.89x run)."""
    import peft

    params = set()
    for name, _ in model.named_parameters():
        if ".mlp.experts." in name and name.rsplit(".", 1)[1] in ("gate_up_proj", "down_proj"):
            params.add(name)
        elif re.search(r"\.mlp(\.shared_experts)?\.(gate|up|down)_proj\.weight$", name):
            params.add(name)
    fused = sorted(re.escape(n) for n in params if n.endswith("gate_up_proj"))
    return peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=[t for t in TARGETS if not t.endswith(("gate_proj", "up_proj", "down_proj"))],
        target_parameters=sorted(params),
        rank_pattern={f: 2 * rank for f in fused},
        alpha_pattern={f: 2 * alpha for f in fused},
    )


def ours(ckpt: Path, data, steps: int, batch: int, lr: float) -> dict:
    from finetune.lora import LoraSettings, add_lora
    from finetune.sft import SFTConfig, train_sft
    from finetune.train_loop import OptimConfig
    from model import GLM5ForCausalLM

    net = add_lora(GLM5ForCausalLM.from_pretrained(ckpt, dtype=torch.float32), LoraSettings(rank=16, alpha=32))
    times: list[float] = []
    train_sft(
        net, data, SFTConfig(OptimConfig(steps=steps, lr=lr, warmup=1), batch_size=batch),
        on_step=lambda i: times.append(i.seconds),
    )
    return {"step_s": times[1:]}


def trl_side(ckpt: Path, data, steps: int, batch: int, lr: float, rank: int = 16, alpha: int = 32) -> dict | None:
    try:
        import trl
    except ImportError:
        return None
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    lora = trl_lora_config(model, rank, alpha)
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


def full_memory(ckpt: Path, data_path: Path, steps: int, threads: int = 0, extra: str = "") -> dict:
    """Peak RSS of a few full fine-tuning steps of the checkpoint, in a fresh process, against the parameter
    count's bound: 4 bytes per weight + 12 per trained one (its gradient and AdamW's two moments, fp32).

    RSS is read from /proc/self/status: the baseline after the imports, before the model loads; the peak is
    VmHWM, reset (clear_refs 5) once the model has loaded, so the loader's own transient copies do not count.
    peak - baseline holds the weights, gradients, optimizer state, activations and allocator slack, and also
    the checkpoint's file pages that the loader's memory map leaves resident (RssFile: page cache, dropped under
    memory pressure, not memory the run allocated). So the anonymous RSS (RssAnon) is sampled every 5 ms too:
    its peak over its baseline is what training allocates, the number held against the bound."""
    code = f"""
import json, sys, torch
sys.path.insert(0, {str(Path(__file__).absolute().parents[1])!r})
if {threads}: torch.set_num_threads({threads})
from model import GLM5ForCausalLM
from finetune.full import prepare_full
from finetune.sft import SFTConfig, train_sft
from finetune.train_loop import OptimConfig

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

base, anon_base = status("VmRSS"), status("RssAnon")
net = GLM5ForCausalLM.from_pretrained({str(ckpt)!r}, dtype=torch.float32)
loaded = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
anon = [status("RssAnon")]
def sample():  # torch's ops release the GIL, so this thread sees the peaks inside them
    while not done.is_set():
        anon.append(status("RssAnon"))
        done.wait(0.005)
import threading
done = threading.Event()
threading.Thread(target=sample, daemon=True).start()
named = prepare_full(net)
data = [tuple(x) for x in json.load(open({str(data_path)!r}))]
cfg = SFTConfig(OptimConfig(steps={steps}, lr=1e-5, warmup=1), batch_size=4{extra})
train_sft(net, data, cfg, named=named)
done.set()
peak = status("VmHWM")
file_end = status("RssFile")
n = sum(p.numel() for p in net.parameters())
t = sum(p.numel() for _, p in named if p.requires_grad)
print(json.dumps({{"params": n, "trained": t, "base_bytes": base, "loaded_bytes": loaded, "peak_bytes": peak,
    "anon_base_bytes": anon_base, "anon_peak_bytes": max(anon), "file_bytes_end": file_end}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the full fine-tuning subprocess failed:\n{r.stderr[-3000:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    bound = d["params"] * 4 + d["trained"] * 12
    growth = d["peak_bytes"] - d["base_bytes"]
    anon = d["anon_peak_bytes"] - d["anon_base_bytes"]
    return {
        **d,
        "bound_bytes": bound,
        "peak_over_base_bytes": growth,
        "peak_over_bound": growth / bound,
        "anon_peak_over_base_bytes": anon,
        "anon_peak_over_bound": anon / bound,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="ours, TRL, ours, TRL, ...: each side's median is reported")
    ap.add_argument("--threads", type=int, default=0, help="torch threads for both sides (0: torch's default)")
    ap.add_argument("--mem-preset", default="small", help="full fine-tuning memory on this preset ('' to skip)")
    ap.add_argument("--mem-steps", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "bench_sft.json"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    res: dict = {"preset": a.preset, "steps": a.steps, "batch": 4, "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_checkpoint(a.preset, Path(tmp) / "ckpt")
        from model.config import preset as get_preset

        data = make_data(a.seqs, a.len, get_preset(a.preset).vocab_size)
        real_tokens_per_step = 4 * sum(len(s) for s, _ in data) / len(data)
        res["tokens_per_step"] = real_tokens_per_step
        rounds: list[dict] = []
        for _ in range(a.rounds):  # interleaved, so that a change in the machine's load hits both sides
            r = {"ours": real_tokens_per_step / median(ours(ckpt, data, a.steps, 4, 2e-4)["step_s"])}
            t = trl_side(ckpt, data, a.steps, 4, 2e-4)
            if t is not None:
                r["trl"] = real_tokens_per_step / median(t["step_s"])
                r["ratio"] = r["ours"] / r["trl"]
                res["trl_version"] = t["trl"]
            rounds.append(r)
            print(json.dumps(r), flush=True)
        res["rounds"] = rounds
        res["ours_tokens_per_s"] = median([r["ours"] for r in rounds])
        if "trl" in rounds[0]:
            res["trl_tokens_per_s"] = median([r["trl"] for r in rounds])
            res["ours_over_trl"] = median([r["ratio"] for r in rounds])
        if a.mem_preset:
            mem_ckpt = ckpt if a.mem_preset == a.preset else make_checkpoint(a.mem_preset, Path(tmp) / "mem_ckpt")
            dp = Path(tmp) / "data.json"
            dp.write_text(json.dumps(data))
            res["full_ft_memory"] = {"preset": a.mem_preset, **full_memory(mem_ckpt, dp, a.mem_steps, a.threads)}
    res["max_rss_kib_parent"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
