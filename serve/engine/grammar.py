"""Constrained decoding: grammars the sampled tokens must follow, as a per-request mask on the logits.

The grammars are xgrammar's (the library sglang and vLLM use; C++ with a CPU matcher, so the same code runs on
a CPU box and beside a GPU): JSON, a JSON schema, and structural tags -- GLM-5's tool-call syntax
`<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>` is xgrammar's `glm_xml` style, whose
values follow each parameter's JSON schema (strings raw, everything else as JSON), exactly what
`model/chat_parse.py` reads back.

- `Grammars(tokenizer, vocab_size)` compiles (and caches) grammars for one tokenizer; `Grammar` is a compiled
  grammar, immutable and shared by every request that uses it.
- `GrammarState` is one request's walk through a grammar. The sampler asks it for the tokens allowed next; it
  first catches up on the tokens the sequence has emitted since it last looked, so it stays right whatever
  happened in between (preemption and recompute, several tokens in one step).

xgrammar is an optional dependency (`pip install 'glm5[grammar]'`: it brings triton and transformers with it);
`available()` says whether it is importable, and nothing here imports it before a grammar is compiled.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import torch

log = logging.getLogger("glm5.serve")

INSTALL_HINT = "pip install 'glm5[grammar]' (xgrammar)"


def available() -> bool:
    return importlib.util.find_spec("xgrammar") is not None


class Grammar:
    """A compiled grammar over one tokenizer's vocabulary. `description` names it in logs and errors."""

    def __init__(self, compiled, vocab_size: int, stop_token_ids: Sequence[int], description: str):
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self.description = description

    def start(self) -> GrammarState:
        return GrammarState(self)

    def __repr__(self) -> str:
        return f"Grammar({self.description})"


class GrammarState:
    """One request's position in its grammar, kept in step with the request's output tokens."""

    def __init__(self, grammar: Grammar):
        import xgrammar as xgr

        self.grammar = grammar
        self.matcher = xgr.GrammarMatcher(grammar.compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)
        self.consumed = 0  # output tokens the matcher has accepted
        self.broken = False  # a token the grammar did not allow was emitted: only a stop token is allowed now

    def catch_up(self, output_token_ids: Sequence[int]) -> None:
        for t in output_token_ids[self.consumed :]:
            if not self.broken and not self.matcher.accept_token(int(t)):
                log.warning("%s: token %d is outside the grammar; ending the request", self.grammar, t)
                self.broken = True
        self.consumed = len(output_token_ids)

    def mask_(self, logits_V: torch.Tensor, output_token_ids: Sequence[int]) -> None:
        """Set the logits of every token the grammar does not allow next to -inf, in place (a row on any
        device: the engine's sampler gets CPU rows; xgrammar applies the bitmask with a CUDA kernel on a GPU)."""
        import xgrammar as xgr

        self.catch_up(output_token_ids)
        V = logits_V.shape[-1]
        if self.broken or self.matcher.is_terminated():
            allowed = torch.zeros(V, dtype=torch.bool, device=logits_V.device)
            allowed[[t for t in self.grammar.stop_token_ids if t < V]] = True
            logits_V.masked_fill_(~allowed, float("-inf"))
            return
        self.matcher.fill_next_token_bitmask(self.bitmask)  # the matcher runs on the CPU; the mask goes to the row
        n = min(V, self.grammar.vocab_size)
        xgr.apply_token_bitmask_inplace(logits_V[None, :n], self.bitmask.to(logits_V.device, non_blocking=True))
        if V > n:  # ids past the tokenizer's vocabulary (padded lm_head rows) are never text
            logits_V[n:] = float("-inf")


# xgrammar writes "at most one whitespace character here" (max_whitespace_cnt=1) as this rule body.
_ONE_SPACE = '("" | ([ \\n\\r\\t]))'


def no_padding(ebnf: str) -> str:
    """The grammar without the optional whitespace xgrammar puts between JSON tokens and around XML values.

    GLM-5's template writes none (`</arg_key><arg_value>`), and `model/chat_parse.py` keeps a string value
    raw, so padding the grammar allowed around an enum string would reach the client as part of the value and
    break the schema. JSON without the padding is still JSON (`{"a":1}`)."""
    return ebnf.replace(_ONE_SPACE, '("")')


class Grammars:
    """Compiles grammars for one tokenizer (glm5's `Tokenizer`) and caches the `cache_size` most recently used by
    their source. Safe to call from several threads (the server compiles off its event loop)."""

    def __init__(self, tokenizer, vocab_size: int | None = None, cache_size: int = 64):
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        self.stop_token_ids = tuple(getattr(tokenizer, "eos_token_ids", ()) or ())
        # Bounded: every request may bring a new schema, and a compiled grammar can take megabytes.
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    @cached_property
    def _compiler(self):
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast  # xgrammar depends on it; it reads the vocabulary

        backend = getattr(self.tokenizer, "_tok", self.tokenizer)
        hf = PreTrainedTokenizerFast(tokenizer_object=backend)
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids)
        # xgrammar's own cache is unbounded by default; ours (`_cache`) is the one that counts, so keep it small.
        return xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=64 * 2**20)

    def _cached(self, key: Any, description: str, build) -> Grammar:
        k = json.dumps(key, sort_keys=True, default=str)
        with self._lock:
            if k in self._cache:
                self._cache.move_to_end(k)
                return self._cache[k]
            compiler = self._compiler  # made once, under the lock
        # Compiled outside the lock, so a slow grammar does not hold up requests whose grammar is cached.
        grammar = Grammar(build(compiler), self.vocab_size, self.stop_token_ids, description)
        with self._lock:
            self._cache[k] = grammar
            self._cache.move_to_end(k)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return grammar

    def structural_tag(self, tag: dict, description: str) -> Grammar:
        """xgrammar's structural-tag JSON (`{"type": "structural_tag", "format": {...}}`), with no whitespace
        between tokens of the structure (see `no_padding`)."""

        def build(compiler):
            import xgrammar as xgr

            return compiler.compile_grammar(no_padding(str(xgr.Grammar.from_structural_tag(json.dumps(tag)))))

        return self._cached(["tag", tag], description, build)

    # ---- the formats the server asks for -----------------------------------------------------------

    def json_format(self, schema: dict | None) -> dict:
        """A structural-tag format for JSON text: any JSON object (schema None) or one following `schema`."""
        return {
            "type": "json_schema",
            "json_schema": {"type": "object"} if schema is None else schema,
            "style": "json",
            "max_whitespace_cnt": 1,
        }

    def tool_call_format(self, tools: list[dict], parallel: bool) -> dict:
        """One or more GLM-5 tool calls (at most one unless `parallel`), each to one of `tools` (OpenAI tool
        dicts) with arguments that follow its parameters' schema, and nothing else."""
        tags = [
            {
                "type": "tag",
                "begin": "<tool_call>" + t["function"]["name"],
                "content": {
                    "type": "json_schema",
                    "json_schema": t["function"].get("parameters") or {"type": "object", "properties": {}},
                    "style": "glm_xml",
                    "max_whitespace_cnt": 1,
                },
                "end": "</tool_call>",
            }
            for t in tools
        ]
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }

    def after_reasoning(self, fmt: dict) -> dict:
        """`fmt` preceded by free reasoning up to `</think>` (the prompt opened the think block)."""
        think = {"type": "tag", "begin": "", "content": {"type": "any_text", "excludes": []}, "end": "</think>"}
        return {"type": "sequence", "elements": [think, fmt]}

    def regex(self, pattern: str) -> Grammar:
        return self._cached(["regex", pattern], "regex", lambda c: c.compile_regex(pattern))

    def ebnf(self, source: str) -> Grammar:
        """A grammar in xgrammar's EBNF (GBNF-like), starting at its `root` rule."""
        return self._cached(["ebnf", source], "EBNF grammar", lambda c: c.compile_grammar(source))

    def compile(self, fmt: dict, description: str) -> Grammar:
        return self.structural_tag({"type": "structural_tag", "format": fmt}, description)
