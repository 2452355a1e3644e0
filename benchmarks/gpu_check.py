"""glm5's own engine on one CUDA GPU: correctness against the plain path, and speed as a share of the hardware's
bounds. Run by benchmarks/gpu_check.sh (one H200, one 10-minute run); `--smoke` runs the same code on CPU with the
tiny preset in seconds (tests and a dry run before a GPU is at hand).

For each model -- `small` (the benchmark preset) and `cut` (GLM-5's real widths, 3 layers: hidden 6144, 256 routed
experts top-8, MLA q/kv ranks 2048/512, the indexer, one MTP layer; random weights, bf16):
  logits   the absorbed MLA forward (the engine's decode path) against the plain 'expanded' path, and bf16
           against fp32 on the same GPU where memory allows (relative L2 error)
  decode   batch-1 greedy decode tokens/s of the engine, and the HBM bound: bytes one token must read (the active
           weights: attention, dense / shared experts and top-k routed experts, lm_head) / HBM bandwidth
  prefill  tokens/s of one 4096-token prefill, and the bf16 FLOP bound: 2 x active params x tokens / peak FLOP/s
  int4     quantize_int4 (group 128): logits against bf16, and decode tokens/s
  mtp      the engine with MTP drafts (3 tokens): greedy output equal to plain decoding, tokens per step
Writes one JSON object (stdout and --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).absolute().parents[1]))

from model.config import GLM5Config, preset  # noqa: E402
from model.modeling import GLM5ForCausalLM  # noqa: E402

H200 = {"hbm_bytes_per_s": 4.8e12, "bf16_flops": 989e12}  # NVIDIA's H200 SXM sheet (dense bf16)


def cut_glm5(layers: int = 3) -> GLM5Config:
    """GLM-5 at its real widths with `layers` layers (the first dense, as GLM-5's first three are) plus MTP."""
    real = preset("glm5")
    return dataclasses.replace(real, num_hidden_layers=layers, first_k_dense_replace=1, mlp_layer_types=None,
                               dtype="bfloat16")  # fmt: skip


def build(cfg: GLM5Config, device: str, dtype: torch.dtype, seed: int = 0) -> GLM5ForCausalLM:
    """Random weights made on the device (a real-width model is tens of GB: no CPU copy)."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # made in bf16: an fp32 copy of the real-width model would not fit
    try:
        with torch.device(device):
            model = GLM5ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if not t.is_floating_point():
                continue
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            elif name.endswith("bias"):
                t.normal_(0, 0.1)
            else:
                t.normal_(0, 0.02)
    return model.to(dtype).eval()


def active_params(cfg: GLM5Config) -> float:
    """Parameters one token reads: everything but the routed experts it is not sent to (and the MTP layer)."""
    model_params = 0
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    with torch.device("meta"):
        meta = GLM5ForCausalLM(cfg)
    for name, p in meta.named_parameters():
        if ".mlp.experts." in name or name.startswith(f"model.layers.{cfg.num_hidden_layers}."):
            continue  # routed experts counted below; the MTP layer is not read by a plain decode
        model_params += p.numel()
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    return model_params + moe_layers * cfg.num_experts_per_tok * expert


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def check_logits(model, device: str, vocab: int) -> dict:
    ids = torch.randint(0, vocab, (2, 64), device=device)
    with torch.no_grad():
        fast = model(ids, attn_impl="absorbed")  # the engine's decode path (weight absorption)
        plain = model(ids, attn_impl="expanded")
        out = {"absorbed_vs_expanded": rel(fast, plain)}
        if device == "cuda" and torch.cuda.mem_get_info()[0] > 3 * sum(p.numel() for p in model.parameters()) * 4:
            ref = model.float()(ids, attn_impl="expanded")
            model.to(torch.bfloat16)
            out["bf16_vs_fp32"] = rel(fast, ref)
    return out


def engine(model, device: str, **kw):
    from serve.engine.llm import LLM

    return LLM(model, device=device, max_num_seqs=4, kv_cache_gib=kw.pop("kv_cache_gib", 4.0), **kw)


def decode_rate(llm, vocab: int, tokens: int) -> float:
    from serve.engine.sampling_params import SamplingParams

    prompt = torch.randint(0, vocab, (32,)).tolist()
    llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    out = llm.generate([prompt], SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))[0]
    return len(out.token_ids) / (time.perf_counter() - t0)


def prefill_rate(model, device: str, vocab: int, tokens: int) -> float:
    ids = torch.randint(0, vocab, (1, tokens), device=device)
    with torch.no_grad():
        model(ids[:, :128], logits_to_keep=1)
        sync(device)
        t0 = time.perf_counter()
        model(ids, logits_to_keep=1)
        sync(device)
    return tokens / (time.perf_counter() - t0)


def run_model(name: str, cfg: GLM5Config, device: str, dtype, hw: dict, args) -> dict:
    from model.quant_int4 import quantize_int4
    from serve.engine.sampling_params import SamplingParams

    t0 = time.perf_counter()
    model = build(cfg, device, dtype)
    res = {"model": name, "build_s": round(time.perf_counter() - t0, 1), "layers": cfg.num_hidden_layers,
           "hidden": cfg.hidden_size, "experts": cfg.n_routed_experts, "active_params": active_params(cfg)}  # fmt: skip
    res["logits"] = check_logits(model, device, cfg.vocab_size)
    bytes_per_token = res["active_params"] * torch.finfo(dtype).bits / 8
    llm = engine(model, device)
    tps = decode_rate(llm, cfg.vocab_size, args.decode_tokens)
    res["decode"] = {"tokens_per_s": tps, "hbm_bound_tokens_per_s": hw["hbm_bytes_per_s"] / bytes_per_token}
    res["decode"]["share_of_hbm_bound"] = tps / res["decode"]["hbm_bound_tokens_per_s"]
    prompt = torch.randint(0, cfg.vocab_size, (24,)).tolist()
    greedy = SamplingParams(max_tokens=args.decode_tokens, temperature=0.0, ignore_eos=True)
    plain_ids = llm.generate([prompt], greedy)[0].token_ids
    del llm
    pps = prefill_rate(model, device, cfg.vocab_size, args.prefill_tokens)
    bound = hw["bf16_flops"] / (2 * res["active_params"])
    res["prefill"] = {"tokens": args.prefill_tokens, "tokens_per_s": pps, "flop_bound_tokens_per_s": bound,
                      "share_of_flop_bound": pps / bound}  # fmt: skip

    def mtp() -> dict:
        spec = engine(model, device, speculative="mtp", num_draft_tokens=3)
        t1 = time.perf_counter()
        mtp_ids = spec.generate([prompt], greedy)[0].token_ids
        return {"greedy_equal": list(mtp_ids) == list(plain_ids),
                "tokens_per_s": len(mtp_ids) / (time.perf_counter() - t1)}  # fmt: skip

    def int4() -> dict:
        with torch.no_grad():
            ids = torch.randint(0, cfg.vocab_size, (1, 48), device=device)
            ref = model(ids)
            quantize_int4(model, strict=False)
            out = {"logits_vs_bf16": rel(model(ids), ref)}
        out["decode_tokens_per_s"] = decode_rate(engine(model, device), cfg.vocab_size, args.decode_tokens)
        return out

    for section, fn in (("mtp", mtp), ("int4", int4)):  # a failure is recorded, and the other numbers kept
        try:
            res[section] = fn()
        except Exception as e:  # noqa: BLE001 -- whatever it is, the record says it
            res[section] = {"error": f"{type(e).__name__}: {e}"}
    model = None  # the next model needs the memory (the closures above hold it by cell)
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny preset, a few tokens: the code path only")
    ap.add_argument("--models", default="small,cut")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.smoke:
        device, dtype, models = "cpu", torch.float32, {"tiny": preset("tiny")}
        args.decode_tokens, args.prefill_tokens = 6, 64
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run on a GPU machine (or --smoke for the code path on CPU)")
        device, dtype = "cuda", torch.bfloat16
        known = {"small": dataclasses.replace(preset("small"), dtype="bfloat16"), "cut": cut_glm5()}
        models = {m: known[m] for m in args.models.split(",")}
    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "bounds": H200, "results": []}  # fmt: skip
    for name, cfg in models.items():
        info["results"].append(run_model(name, cfg, device, dtype, H200, args))
        print(json.dumps(info["results"][-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
