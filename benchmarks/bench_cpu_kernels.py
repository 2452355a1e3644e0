"""What glm5's fused CPU kernels (model/kernels) are worth: the same model, the same process, kernels on and
off (the torch references), interleaved.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_cpu_kernels.py [--preset small] [--tokens 512] [--pairs 12]

For the model's forward (logits for every position) and for a serving prefill (one engine step: cache written,
next-token logits), it checks that the outputs are identical with and without the kernels, then times both
settings in alternating order and prints the median CPU time of each and the median speed-up within pairs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    from model import GLM5ForCausalLM, kernels, preset
    from model.kernels import build
    from serve.engine import EngineConfig, LLMEngine, SamplingParams

    torch.set_num_threads(args.threads)
    model = GLM5ForCausalLM.from_config(preset(args.preset).replace(dtype="float32"), seed=0).eval()
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size - 64, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    engine = LLMEngine(
        model,
        config=EngineConfig(
            max_num_seqs=1,
            block_size=16,
            num_kv_blocks=args.tokens // 16 + 4,
            max_num_batched_tokens=args.tokens,
            enable_prefix_caching=False,  # the same prompt every time: a cache hit would skip the work
        ),
    )
    prompt = ids[0].tolist()

    def serve():
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=5))
        return engine.step()[0].logprobs[0].top

    print(kernels.status())
    if build.load() is None:
        raise SystemExit("no kernels to compare")

    def use(on: bool) -> None:
        kernels.set_impl("fused" if on else "torch")

    print(f"{args.preset}, {args.tokens} tokens, fp32, {args.threads} thread(s), {args.pairs} pairs, CPU time")
    for name, run in (("forward", lambda: model(ids)), ("serving prefill", serve)):
        times: dict[bool, list[float]] = {False: [], True: []}
        with torch.inference_mode():
            outs = []
            for on in (False, True):
                use(on)
                outs.append(run())
            same = torch.equal(*outs) if name == "forward" else outs[0] == outs[1]
            for rep in range(args.pairs):
                for on in (False, True) if rep % 2 else (True, False):
                    use(on)
                    t0 = time.process_time()
                    run()
                    times[on].append(time.process_time() - t0)
        use(True)
        pairs = sorted(off / on for off, on in zip(times[False], times[True], strict=True))
        print(
            f"{name}: outputs identical {same}; torch references {statistics.median(times[False]) * 1e3:.1f} ms, "
            f"kernels {statistics.median(times[True]) * 1e3:.1f} ms; speed-up within pairs median "
            f"{statistics.median(pairs):.3f}x, range {pairs[0]:.3f}-{pairs[-1]:.3f}x"
        )


if __name__ == "__main__":
    main()
