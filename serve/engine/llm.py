"""Offline entry point: `LLM(path).generate(prompts, params)`, as in vLLM.

from serve import LLM, SamplingParams
llm = LLM("ckpt/", max_num_seqs=16)
outs = llm.generate(["def fib(n):", [154822, 154824, 42]], SamplingParams(temperature=0, max_tokens=32))
outs[0].token_ids, outs[0].text, outs[0].logprobs, outs[0].finish_reason
"""

from __future__ import annotations

from pathlib import Path

import torch

from model.modeling import GLM5ForCausalLM
from model.tokenizer import Tokenizer
from serve.engine.config import EngineConfig
from serve.engine.engine import LLMEngine
from serve.engine.request_output import RequestOutput
from serve.engine.sampling_params import SamplingParams

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """ "auto": bf16 on a GPU; fp32 on CPU, where bf16 matrix-vector products measured slower
    (benchmarks/RESULTS.md, engine section)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
    return _DTYPES[dtype]


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when it ships none (then prompts must be token ids)."""
    if not (path / "tokenizer.json").is_file():
        return None
    return Tokenizer.from_dir(path)


class LLM:
    """A checkpoint directory (or a model instance) behind the engine. Keyword arguments beyond
    `dtype`, `device` and `tokenizer` are `EngineConfig` fields (max_num_seqs, block_size, ...)."""

    def __init__(self, model, tokenizer=None, dtype: str | torch.dtype = "auto", device: str = "cpu", **engine_kwargs):
        if isinstance(model, (str, Path)):
            path = Path(model)
            model = GLM5ForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, device), device=device)
            if tokenizer is None:
                tokenizer = load_tokenizer(path)
        elif dtype != "auto":
            model = model.to(resolve_dtype(dtype, device))
        self.engine = LLMEngine(model, tokenizer, EngineConfig(**engine_kwargs), device=device)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run the prompts to completion, batched together; outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        done: dict[str, RequestOutput] = {}
        try:
            while self.engine.has_unfinished:
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
        except BaseException:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return [done[rid] for rid in ids]
