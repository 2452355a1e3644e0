"""Each side of bench_prefill's forward timed right after itself and right after the other (CPU time).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_prefill_eviction.py

Six rounds of [ours, ours, transformers, transformers]: the first run of each pair follows the other model, which
has just streamed its own copy of the weights through the machine's shared cache; the second follows itself.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import transformers

    from model import GLM5ForCausalLM
    from model.config import preset

    torch.set_num_threads(1)
    cfg = preset("small").replace(rms_norm_eps=1e-6, dtype="float32")
    ours = GLM5ForCausalLM.from_config(cfg, seed=0).eval()
    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        transformers.logging.set_verbosity_error()
        hf = transformers.GlmMoeDsaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size - 64, (1, 512), generator=torch.Generator().manual_seed(0))
    runs = {"ours after hf": [], "ours after ours": [], "hf after ours": [], "hf after hf": []}

    def cpu_ms(fn) -> float:
        c0 = time.process_time()
        fn()
        return (time.process_time() - c0) * 1e3

    with torch.inference_mode():
        ours(ids)
        hf(ids)
        for _ in range(6):
            runs["ours after hf"].append(cpu_ms(lambda: ours(ids)))
            runs["ours after ours"].append(cpu_ms(lambda: ours(ids)))
            runs["hf after ours"].append(cpu_ms(lambda: hf(ids)))
            runs["hf after hf"].append(cpu_ms(lambda: hf(ids)))
    for name, ms in runs.items():
        print(f"{name:16s} median {statistics.median(ms):6.0f} ms, fastest {min(ms):6.0f} ms  {[round(x) for x in ms]}")


if __name__ == "__main__":
    main()
