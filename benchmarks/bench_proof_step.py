"""One training step of the proof's model on one recorded session: where its time goes (issue 21).

    python benchmarks/bench_proof_step.py CKPT TRAJECTORY... [--threads 1,0] [--rounds 2] [--profile]

CKPT: `glm5 model init` with the proof's settings (finetune/proof/config.py PROOF_MODEL); TRAJECTORY: sessions
`glm5 bench swe` recorded (RUN/expert/trials/*/*/trajectory.jsonl; e.g. one per agent profile). Times one
full-parameter forward+backward of the SFT loss (finetune/sft.py sft_loss, the proof's loss without the MTP term)
per session and thread count, interleaved over rounds so that a changing load hits every setting alike;
--profile adds torch.profiler's top operators (first session, one thread). Prints
one JSON line per measurement. `--threads 0` is torch's default (one per core).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("trajectory", type=Path, nargs="+")
    ap.add_argument("--threads", default="1,0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()

    from finetune.data.sources import load_sequences
    from finetune.data.trajectories import DataOptions
    from finetune.sft import sft_loss
    from model.modeling import GLM5ForCausalLM
    from serve.engine.llm import load_tokenizer

    tok = load_tokenizer(a.ckpt)
    sessions = []
    for path in a.trajectory:
        seqs, _ = load_sequences([path], tok, DataOptions(only_resolved=False))
        seq = max(seqs, key=lambda s: len(s.ids))  # the whole session (the last branch holds every turn)
        sessions.append((path, seq, torch.tensor([seq.ids]), torch.tensor([seq.mask])))
    model = GLM5ForCausalLM.from_pretrained(a.ckpt, dtype=torch.float32)
    model.train()
    default_threads = torch.get_num_threads()

    def step(ids: torch.Tensor, mask: torch.Tensor) -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        sft_loss(model, ids, mask).loss.backward()
        return time.perf_counter() - t0

    for r in range(a.rounds):
        for path, seq, ids, mask in sessions:
            for n in (int(x) for x in a.threads.split(",")):
                torch.set_num_threads(n or default_threads)
                s = step(ids, mask)
                print(json.dumps({"round": r, "session": str(path), "threads": torch.get_num_threads(),
                                  "tokens": len(seq.ids), "targets": int(sum(seq.mask)), "step_s": round(s, 2)}),
                      flush=True)  # fmt: skip
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        torch.set_num_threads(1)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            step(*sessions[0][2:])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
