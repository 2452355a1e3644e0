"""LoRA over a frozen base that no process holds whole (finetune/sharded_load.py), on `small` (~190M parameters)
with an FP8 base (GLM-5-FP8's layout, random weights) and an INT4 base (`glm5 model quantize` of a random `small`):
2 gloo ranks (torchrun) against one process of the same code. Per rank: the loss curve (must equal one
process's), the bytes of the base it holds (its shards; one process holds all), the adapter's bytes, peak RSS and
address space used past the imports; and what `glm5 finetune plan` says for that layout. Writes
benchmarks/bench_qlora_sharded.json.

    .venv/bin/python benchmarks/bench_qlora_sharded.py [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).absolute().parents[1]
sys.path.insert(0, str(ROOT))


def run(ckpt: Path, nproc: int, steps: int, out: Path) -> dict:
    from tests.serve.conftest import find_free_port

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2",
               MALLOC_MMAP_THRESHOLD_="131072")  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--master-port={find_free_port()}",
           str(ROOT / "tests/finetune/qlora_worker.py"), str(ckpt), str(out), "--steps", str(steps)]  # fmt: skip
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True, timeout=3000)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    from finetune.plan import Layout, plan
    from model.config import GLM5Config, preset
    from tests.finetune.quantized_ckpt import write_dense, write_int4, write_random_fp8

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = preset("small").replace(num_nextn_predict_layers=0)
        ckpts = {"fp8": write_random_fp8(tmp / "fp8", cfg)}
        write_dense(tmp / "dense", "small", num_nextn_predict_layers=0)
        ckpts["int4"] = write_int4(tmp / "dense", tmp / "int4", group_size=128)
        for base, ckpt in ckpts.items():
            one, two = (run(ckpt, n, a.steps, tmp / f"{base}-{n}.json")["ranks"] for n in (1, 2))
            rows = plan(GLM5Config.from_pretrained(ckpt), Layout(gpus=2, base=base, lora_rank=4, dense_bytes=4)).rows
            results[base] = {
                "one_process": one[0],
                "ranks": two,
                "losses_equal": all(
                    abs(x - y) <= 1e-5 * abs(y) for r in two for x, y in zip(r["losses"], one[0]["losses"], strict=True)
                ),  # fmt: skip
                "loss_rel_diff_per_step": [
                    max(abs(r["losses"][k] - y) / abs(y) for r in two) for k, y in enumerate(one[0]["losses"])
                ],  # fmt: skip
                "base_bytes_rank_over_one": [r["base_bytes"] / one[0]["base_bytes"] for r in two],
                "plan_weights_per_rank": rows["weights"],
                "plan_adapter_per_rank": rows["adapter"],
            }
            print(base, json.dumps(results[base], indent=1), flush=True)
    (ROOT / "benchmarks/bench_qlora_sharded.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
