"""MTP speculative decoding benchmark, CPU: train a GLM-5-shaped model with its MTP layer, then measure how many
tokens a speculative step yields and whether it is faster. Prints a markdown report and writes JSON.

    python benchmarks/bench_mtp.py --threads 1 --out benchmarks/mtp_results.json

Sections (ratios are measured in the same run, alternating the two sides, so machine load hits both alike):
  train       the `--preset` model (default tiny) trained from scratch with mtp_loss (LM + 3 chained MTP steps)
              on Python standard-library sources, for a wall-clock budget; held-out losses before and after
  align       the MTP layer aligned with its own main model (finetune/mtp_align.py): greedy continuations of
              training-text prompts from the engine, then the MTP layer alone trained on them (the main model,
              and so every output, is unchanged); `--align-steps 0` skips it
  acceptance  before and after aligning: greedy acceptance length (tokens per verification) and rate at k = 1, 2, 3 in the engine on
              held-out code, outputs checked identical to decoding without speculation; the plain-model
              reference (tests/serve/engine/spec_reference.py) on one prompt, as a cross-check
  speed       batch-1 decode tokens/s with and without speculation (k = 1, 2, 3), after aligning; and k = 3
              drafting from draft vocabularies of V/4 and V/16 tokens ranked by the model's own generations
              (`--draft-vocab-fractions`), with their acceptance (drafts outside the set can no longer match)
  cost        where a speculative step's time goes: verification forward vs a decode step, MTP extend, each
              chained draft step, one lm_head call; distinct routed experts a step reads per MoE layer
              (decode vs verification); the same ratios on the `small` preset (random weights), and the
              speed-up they imply for small at the acceptance measured here
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).absolute().parents[1]))

from finetune.data.batches import token_batches  # noqa: E402
from finetune.mtp_align import align_mtp, draft_vocab, generate_sequences  # noqa: E402
from finetune.mtp_objective import MTPTrainConfig, mtp_loss, train_mtp  # noqa: E402
from finetune.train_loop import OptimConfig  # noqa: E402
from model.config import preset  # noqa: E402
from model.modeling import GLM5ForCausalLM  # noqa: E402
from model.tokenizer import Tokenizer  # noqa: E402
from serve.engine.config import EngineConfig  # noqa: E402
from serve.engine.engine import LLMEngine  # noqa: E402
from serve.engine.sampling_params import SamplingParams  # noqa: E402
from serve.engine.spec_decode import SpecMetrics  # noqa: E402
from tests.serve.engine.spec_reference import speculative_greedy  # noqa: E402


def corpus(tok: Tokenizer, max_chars: int) -> tuple[list[int], list[int]]:
    """Python stdlib sources (sorted, concatenated) -> (train ids, held-out ids): every 20th file is held out."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    train, held, n = [], [], 0
    for i, f in enumerate(files):
        text = f.read_text(errors="replace")
        (held if i % 20 == 7 else train).append(text)
        n += len(text)
        if n > max_chars:
            break
    return tok.encode("\n\n".join(train)), tok.encode("\n\n".join(held))


@torch.no_grad()
def held_out_loss(model, ids: list[int], seq_len: int, n: int = 4) -> dict:
    model.eval()
    batch = next(token_batches(ids, seq_len, n, seed=123))
    out = mtp_loss(model, batch)
    return {"lm": round(out.lm, 3), "mtp": [round(x, 3) for x in out.mtp]}


@torch.no_grad()
def teacher_forced_accuracy(model, ids: list[int], seq_len: int, k: int = 3, n: int = 8) -> dict:
    """Top-1 accuracy on held-out text: the main model (token t+1) and each chained MTP step (token t+2+j),
    computed as in training (every step over the whole sequence); and how often MTP step j agrees with the
    main model's own prediction of the same token, which is what greedy acceptance needs."""
    model.eval()
    x = next(token_batches(ids, seq_len, n, seed=321))
    T = x.shape[1]
    logits, h = model(x, return_hidden=True)
    main_pred = logits.argmax(-1)  # [n, T]: main's guess of token t+1
    out = {
        "main": round(float((main_pred[:, :-1] == x[:, 1:]).float().mean()), 3),
        "mtp": [],
        "mtp_agrees_with_main": [],
    }
    for j in range(k):
        m = T - 1 - j
        d, h = model.mtp_forward(h[:, :m], x[:, 1 + j :], torch.arange(1 + j, T), step=j)
        pred = d[:, : m - 1].argmax(-1)  # guess of token t+2+j
        out["mtp"].append(round(float((pred == x[:, 2 + j :]).float().mean()), 3))
        out["mtp_agrees_with_main"].append(round(float((pred == main_pred[:, 1 + j : T - 1]).float().mean()), 3))
    return out


def train(args, tok) -> tuple[GLM5ForCausalLM, dict]:
    train_ids, held_ids = corpus(tok, args.corpus_chars)
    model = GLM5ForCausalLM.from_config(preset(args.preset), seed=0)
    before = held_out_loss(model, held_ids, args.seq_len)
    batches = token_batches(train_ids, args.seq_len, args.batch, seed=0)
    steps = args.train_steps
    cfg = MTPTrainConfig(OptimConfig(steps=steps, lr=args.lr, warmup=max(1, steps // 10)))
    t = time.perf_counter()
    hist = train_mtp(model, batches, cfg, log_every=max(1, steps // 8), log=lambda s: print("  " + s, flush=True))
    seconds = time.perf_counter() - t
    after = held_out_loss(model, held_ids, args.seq_len)
    accuracy = teacher_forced_accuracy(model, held_ids, args.seq_len)
    info = {
        "preset": args.preset,
        "train_tokens": len(train_ids),
        "held_out_tokens": len(held_ids),
        "steps": steps,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "seconds": round(seconds, 1),
        "final_train_loss": {"lm": round(hist[-1].lm, 3), "mtp": [round(x, 3) for x in hist[-1].mtp]},
        "held_out_before": before,
        "held_out_after": after,
        "held_out_top1_accuracy": accuracy,
    }
    return model, info | {"held_ids": held_ids, "train_ids": train_ids}


def align(model, train_ids: list[int], args) -> tuple[list[tuple[list[int], int]], dict]:
    """Align the MTP layer with the main model on its own greedy continuations of training-text prompts."""
    gen = torch.Generator().manual_seed(7)
    plen = 32
    starts = torch.randint(0, len(train_ids) - plen, (args.align_prompts,), generator=gen).tolist()
    t = time.perf_counter()
    seqs = generate_sequences(model, [train_ids[s : s + plen] for s in starts], args.align_new_tokens, ignore_eos=True)
    gen_s = time.perf_counter() - t
    cfg = MTPTrainConfig(OptimConfig(steps=args.align_steps, lr=3e-3, warmup=10), train_main=False)
    t = time.perf_counter()
    hist = align_mtp(
        model, seqs, cfg, batch_size=8, log_every=max(1, args.align_steps // 6), log=lambda s: print("  " + s)
    )
    return seqs, {
        "sequences": len(seqs),
        "tokens_generated": sum(len(s) - p for s, p in seqs),
        "generate_seconds": round(gen_s, 1),
        "train_seconds": round(time.perf_counter() - t, 1),
        "targets": cfg.targets,
        "mtp_loss_first_last": [round(hist[0].mtp_mean, 3), round(hist[-1].mtp_mean, 3)],
    }


def held_prompts(held_ids: list[int], n: int, length: int) -> list[list[int]]:
    stride = max(length, (len(held_ids) - length) // n)
    return [held_ids[i * stride : i * stride + length] for i in range(n)]


def make_engine(model, k: int | None, **kw) -> LLMEngine:
    spec = dict(speculative="mtp", num_draft_tokens=k) if k else {}
    return LLMEngine(model, config=EngineConfig(num_kv_blocks=256, block_size=16, **spec, **kw))


def run_all(engine: LLMEngine, prompts, new_tokens: int) -> list[list[int]]:
    ids = [
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)) for p in prompts
    ]
    done = {}
    while engine.has_unfinished:
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o.token_ids
    return [done[i] for i in ids]


def acceptance(model, prompts, new_tokens: int, tok, vocabs: dict[str, tuple[int, ...]] | None = None) -> dict:
    base = run_all(make_engine(model, None), prompts, new_tokens)
    # How repetitive the greedy text is matters: a loop is easy to draft. Report it beside the acceptance.
    out: dict = {
        "distinct_token_fraction": round(statistics.mean(len(set(b)) / len(b) for b in base), 3),
        "sample_continuation": tok.decode(base[0]),
    }
    settings = [(k, k, {}) for k in (1, 2, 3)]
    settings += [(f"3, draft vocab {name}", 3, {"draft_vocab": v}) for name, v in (vocabs or {}).items()]
    for key, k, kw in settings:
        eng = make_engine(model, k, **kw)
        toks = run_all(eng, prompts, new_tokens)
        m = eng.runner.spec_metrics
        out[key] = {
            "identical_to_no_speculation": toks == base,
            "acceptance_length": round(m.mean_acceptance_length, 3),
            "acceptance_rate": round(m.acceptance_rate, 3),
            "accepted_at_position": [round(a / max(1, m.num_verifications), 3) for a in m.accepted_at],
        }
    return out


def decode_time(
    model, k: int | None, prompt: list[int], new_tokens: int, counter=None, **engine_kw
) -> tuple[float, LLMEngine]:
    """Seconds for the decode steps of one request (after its first token), batch 1. Speculation metrics and
    the expert counter cover the decode steps only."""
    eng = make_engine(model, k, max_num_seqs=1, **engine_kw)
    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=new_tokens + 1, ignore_eos=True))
    eng.step()  # prefill + first token (+ first drafts)
    if k:
        eng.runner.spec_metrics = SpecMetrics(k, accepted_at=[0] * k)
    if counter is not None:
        counter.counts.clear()
    t = time.perf_counter()
    while eng.has_unfinished:
        eng.step()
    return time.perf_counter() - t, eng


def speed(model, prompts, new_tokens: int, rounds: int, vocabs: dict[str, tuple[int, ...]] | None = None) -> dict:
    """Each round runs every prompt under every setting back to back; a setting's rate is its total tokens over
    its total time, and the per-round ratios show how much the machine's load moved. With `vocabs`, k = 3 also
    runs with each of those draft vocabularies."""
    names = [("none", None, {}), ("k=1", 1, {}), ("k=2", 2, {}), ("k=3", 3, {})]
    names += [(f"k=3, draft vocab {name}", 3, {"draft_vocab": v}) for name, v in (vocabs or {}).items()]
    times: dict[str, list[float]] = {n: [0.0] * rounds for n, _, _ in names}
    decode_time(model, 3, prompts[0], 4)  # warm-up (fusion, allocator)
    for r in range(rounds):
        # Settings interleaved per prompt (each request is ~0.1-0.3 s), in an order that rotates with the
        # prompt, so that a load spike of a second or two lands on all settings rather than on one.
        for i, p in enumerate(prompts):
            for j in range(len(names)):
                name, k, kw = names[(i + r + j) % len(names)]
                times[name][r] += decode_time(model, k, p, new_tokens, **kw)[0]
    tokens = rounds * len(prompts) * new_tokens
    out = {}
    for name, _, _ in names:
        per_round = [b / s for b, s in zip(times["none"], times[name], strict=True)]
        out[name] = {
            "tokens_per_s": round(tokens / sum(times[name]), 2),
            "speedup": round(sum(times["none"]) / sum(times[name]), 3),
            "speedup_per_round": [round(x, 2) for x in per_round],
            "speedup_median_round": round(statistics.median(per_round), 3),
            # Load spikes only ever slow a round down: the fastest round of each side is the least disturbed.
            "speedup_best_rounds": round(min(times["none"]) / min(times[name]), 3),
        }
    return out


class ExpertCounter:
    """Distinct routed experts each call of each main MoE router picked (the experts a step must read)."""

    def __init__(self, model):
        self.counts: list[int] = []
        L = model.config.num_hidden_layers
        self.handles = [
            layer.mlp.gate.register_forward_hook(self._hook)
            for layer in model.model.layers[:L]
            if hasattr(layer.mlp, "gate")
        ]

    def _hook(self, module, inputs, out):
        self.counts.append(int(out[1].unique().numel()))

    def mean(self) -> float:
        return statistics.mean(self.counts) if self.counts else 0.0

    def close(self):
        for h in self.handles:
            h.remove()


def step_profile(model, k: int | None, prompt: list[int], steps: int) -> dict[str, float]:
    """ms per step in the runner's labelled parts (attention, mlp: main and MTP layers together), profiled."""
    from torch.profiler import ProfilerActivity, profile

    eng = make_engine(model, k, max_num_seqs=1)
    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=steps * 8 + 8, ignore_eos=True))
    for _ in range(3):
        eng.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            eng.step()
    return {
        e.key: round(e.cpu_time_total / 1e3 / steps, 2) for e in prof.key_averages() if e.key in ("attention", "mlp")
    }


def lm_head_ms(model, repeats: int = 50) -> float:
    h = torch.randn(1, model.config.hidden_size)
    with torch.inference_mode():
        model.lm_head(h)
        t = time.perf_counter()
        for _ in range(repeats):
            model.lm_head(h)
    return (time.perf_counter() - t) / repeats * 1e3


def cost(model, prompt: list[int], new_tokens: int, k: int = 3) -> dict:
    """Per-step costs at batch 1, ms: a plain decode step vs the parts of a speculative step."""
    counter = ExpertCounter(model)
    decode_time(model, k, prompt, 4)  # warm-up
    base_s, base_eng = decode_time(model, None, prompt, new_tokens, counter)
    base_experts = counter.mean()
    spec_s, eng = decode_time(model, k, prompt, new_tokens, counter)
    counter.close()
    spec_experts = counter.mean()  # main layers only (the MTP layer's router is not hooked)
    m = eng.runner.spec_metrics
    steps = eng.metrics().num_steps - 1
    decode_ms = base_s / (base_eng.metrics().num_steps - 1) * 1e3
    out = {
        "decode_step_ms": round(decode_ms, 2),
        "spec_step_ms": round(spec_s / steps * 1e3, 2),
        "verify_forward_ms": round(m.forward_s / steps * 1e3, 2),
        "mtp_extend_ms": round(m.extend_s / steps * 1e3, 2),
        "draft_chain_ms_per_step": round(m.chain_s / steps * 1e3, 2),
        "chained_mtp_steps_per_spec_step": round(m.num_chain_steps / steps, 2),
        "lm_head_ms": round(lm_head_ms(model), 3),
        "experts_per_moe_layer_decode": round(base_experts, 2),
        "experts_per_moe_layer_spec": round(spec_experts, 2),
        "acceptance_length": round(m.mean_acceptance_length, 3),
    }
    out["profile_decode_ms"] = step_profile(model, None, prompt, 8)
    out["profile_spec_k3_ms"] = step_profile(model, k, prompt, 8)
    out["verify_over_decode"] = round(out["verify_forward_ms"] / decode_ms, 3)
    out["drafting_over_decode"] = round((out["mtp_extend_ms"] + out["draft_chain_ms_per_step"]) / decode_ms, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-steps", type=int, default=350)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=6e-3)
    ap.add_argument("--corpus-chars", type=int, default=1_500_000)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cost-preset", default="small", help="preset whose step costs are measured (random weights)")
    ap.add_argument("--align-prompts", type=int, default=256, help="training-text prompts to continue for aligning")
    ap.add_argument("--align-new-tokens", type=int, default=96)
    ap.add_argument("--align-steps", type=int, default=300, help="MTP-only training steps on them (0: no aligning)")
    ap.add_argument(
        "--draft-vocab-fractions",
        default="4,16",
        help="draft vocabularies of V/n tokens to measure, comma-separated n (empty: none)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None, help="save the trained checkpoint here")
    ap.add_argument("--load", type=Path, default=None, help="skip training: load a checkpoint --save wrote")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    tok = Tokenizer.shipped()
    report: dict = {"machine": f"{platform.machine()}, torch {torch.__version__}, {args.threads} thread(s)"}

    if args.load:
        model = GLM5ForCausalLM.from_pretrained(args.load).eval()
        train_ids, held_ids = corpus(tok, args.corpus_chars)
        report["train"] = json.loads((args.load / "train_info.json").read_text())
    else:
        print(f"## train ({args.preset}, {args.train_steps} steps)", flush=True)
        model, info = train(args, tok)
        held_ids, train_ids = info.pop("held_ids"), info.pop("train_ids")
        report["train"] = info
        if args.save:
            model.save_pretrained(args.save)
            (args.save / "train_info.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(report["train"], indent=1), flush=True)

    prompts = held_prompts(held_ids, args.prompts, args.prompt_len)
    vocabs: dict[str, tuple[int, ...]] = {}
    if args.align_steps:
        print("## acceptance before aligning (greedy, engine)", flush=True)
        report["acceptance_before_align"] = acceptance(model, prompts, args.new_tokens, tok)
        print(json.dumps(report["acceptance_before_align"], indent=1), flush=True)
        print(f"## align ({args.align_prompts} prompts, {args.align_steps} MTP-only steps)", flush=True)
        seqs, report["align"] = align(model, train_ids, args)
        # Draft vocabularies ranked by the model's own generations: V/4 is FR-Spec's share for Llama-3 (32K of
        # 128K); V/16 would be 9.7K of GLM-5's 155K. How few tokens this small model's generations actually use
        # is reported beside them.
        for n in [int(x) for x in args.draft_vocab_fractions.split(",") if x.strip()]:
            vocabs[f"V/{n}"] = tuple(draft_vocab(seqs, size=model.config.vocab_size // n, fallback=train_ids))
        report["align"]["draft_vocab_sizes"] = {name: len(v) for name, v in vocabs.items()}
        report["align"]["tokens_covering_99pct_of_generations"] = len(draft_vocab(seqs, coverage=0.99))
        print(json.dumps(report["align"], indent=1), flush=True)
    print("## acceptance (greedy, engine)", flush=True)
    report["acceptance"] = acceptance(model, prompts, args.new_tokens, tok, vocabs)
    ref = speculative_greedy(model, prompts[0], k=3, max_tokens=min(24, args.new_tokens))
    report["acceptance_plain_reference_k3_prompt0"] = round(ref.acceptance_length, 3)
    print(
        json.dumps(report["acceptance"], indent=1),
        "plain reference k=3:",
        report["acceptance_plain_reference_k3_prompt0"],
        flush=True,
    )

    print("## speed (batch 1)", flush=True)
    report["speed"] = speed(model, prompts, args.new_tokens, args.rounds, vocabs)
    print(json.dumps(report["speed"], indent=1), flush=True)

    print(f"## cost ({args.preset}, trained)", flush=True)
    report["cost_trained"] = cost(model, prompts[1 % len(prompts)], args.new_tokens)
    print(json.dumps(report["cost_trained"], indent=1), flush=True)

    print(f"## cost ({args.cost_preset}, random weights)", flush=True)
    big = GLM5ForCausalLM.from_config(preset(args.cost_preset), seed=0).eval()
    c = cost(big, prompts[0], 16)
    acc = report["acceptance"][3]["acceptance_length"]
    c["implied_speedup_at_measured_acceptance_k3"] = round(
        acc / (c["verify_over_decode"] + c["drafting_over_decode"]), 3
    )
    report["cost_" + args.cost_preset] = c
    print(json.dumps(c, indent=1), flush=True)
    report["total_seconds"] = round(time.perf_counter() - t_all, 1)
    print(f"total {report['total_seconds']} s")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
