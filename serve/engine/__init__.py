"""The embedded inference engine (split as nano-vllm). Only model_runner touches tensors.

Module map:
- sampling_params.py  SamplingParams: per-request sampling and stop settings (vLLM / OpenAI names)
- sequence.py         Sequence: one request's tokens, block table, computed count, seeded generator
- block_manager.py    BlockManager: paged KV blocks, reference counts, hash-chained prefix caching, LRU
- scheduler.py        Scheduler: continuous batching, chunked prefill under a token budget, preemption
- kv_cache.py         KVCache: the paged tensors (c_kv, k_pe, index key per layer and token slot)
- model_runner.py     ModelRunner: one step over the paged cache (varlen prefill, batched sparse decode);
                      a plain path (the model's modules) and a fast path checked against it
- fused_weights.py    fuse_layer: linears that read the same input share one weight tensor (fast path)
- sampler.py          Sampler: penalties, temperature, top-k/p, min-p, per-request seeds, exact logprobs,
                      grammar masks for constrained requests
- grammar.py          Grammars / Grammar / GrammarState: xgrammar grammars (JSON, JSON schema, GLM-5 tool calls)
                      as per-request logits masks (optional dependency: glm5[grammar])
- spec_decode.py      SpecModelRunner: MTP speculative decoding (paged MTP cache, chained drafts, verification)
- rejection_sampler.py  the acceptance rule: greedy, and exact speculative sampling with target logprobs
- detokenizer.py      Detokenizer: incremental text and stop strings (skipped with SamplingParams.detokenize=False)
- request_output.py   RequestOutput: what a request produced so far
- config.py           EngineConfig: batch and cache sizes, attention path
- engine.py           LLMEngine: step() = schedule -> run -> postprocess; abort; metrics; update_weights
- llm.py              LLM: offline generate() over a checkpoint directory
- async_llm.py        AsyncLLM: background engine thread, an async generator per request, abort

Life of a request: LLM.generate / AsyncLLM.generate -> LLMEngine.add_request (tokenise, Sequence,
Scheduler.waiting) -> each step: Scheduler.schedule (admit: BlockManager.allocate reuses cached prefix
blocks; chunk prompts under the budget; preempt if blocks run out) -> ModelRunner.run (write cache
entries, DSA top-k, attention, lm_head, Sampler) -> Scheduler.postprocess (append token, register full
blocks, EOS / max_tokens) -> Detokenizer (text, stop strings) -> RequestOutput; finished or aborted
requests free their blocks at once.

With `speculative="mtp"` the runner is a SpecModelRunner: a decoding chunk carries the sequence's drafts,
the step's forward verifies them, the scheduler appends every accepted token, and the MTP layer drafts the
next ones (see spec_decode.py).
"""

from serve.engine.async_llm import AsyncLLM
from serve.engine.config import EngineConfig
from serve.engine.engine import EngineMetrics, LLMEngine
from serve.engine.llm import LLM
from serve.engine.request_output import RequestOutput
from serve.engine.sampling_params import SamplingParams
from serve.engine.sequence import TokenLogprob

__all__ = [
    "AsyncLLM",
    "EngineConfig",
    "EngineMetrics",
    "LLM",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]
