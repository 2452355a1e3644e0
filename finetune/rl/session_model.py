"""The model an RL session's agent talks to: the agent loop's `Model` (query(messages, tools) -> ModelResponse)
over a rollout server, recording every call token in, token out.

Where `glm5 code` sends messages to an OpenAI endpoint, an RL session's agent sends them here: the prompt ids
come from the session's `TitoSession` (appended, never re-tokenized), the rollout server samples ids with
their logprobs and weight version, the ids are decoded and parsed by our GLM-5 parser into the assistant
message the loop appends, and the call is recorded for training. Seeds are (run seed, group, sample, call
number): a rerun samples the same tokens from the same weights.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from agent.client import Cancelled, ContextLengthError, ModelResponse
from finetune.rl.env import ServerFailure
from finetune.rl.server import GenParams, RolloutServer
from finetune.rl.tito import TitoSession
from model.chat_parse import parse


class SessionModel:
    def __init__(
        self,
        server: RolloutServer,
        tokenizer,
        session: str,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        keep_reasoning: bool = False,
        max_model_len: int | None = None,
        thinking: bool = True,
    ):
        self.server = server
        self.tok = tokenizer
        self.session = session
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.max_model_len = max_model_len
        self.thinking = thinking
        self.tito = TitoSession(tokenizer, keep_reasoning=keep_reasoning, thinking=thinking)
        self.cancel_event = threading.Event()
        self.failure: BaseException | None = None  # the server's error, kept: agent loops catch what they can

    def query(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, on_delta=None):
        if self.cancel_event.is_set():  # the run is stopping: the agent loop ends the session as interrupted
            raise Cancelled("the RL run is stopping")
        branch, ids = self.tito.prompt(messages, tools or None)
        if self.max_model_len is not None and len(ids) + 1 >= self.max_model_len:
            self.tito.branches[branch].messages = []  # nothing more extends this branch
            raise ContextLengthError(f"the prompt ({len(ids)} tokens) does not fit the context ({self.max_model_len})")
        t0 = time.monotonic()
        out = self._generate(ids)
        text = self.tok.decode(out.ids, skip_special_tokens=False)
        msg = parse(text, tools, thinking=self.thinking).to_message()
        finish = "tool_calls" if msg.get("tool_calls") else out.finish_reason
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(out.ids), "total_tokens": len(ids) + len(out.ids)}
        raw = {
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": usage,
            "prompt_token_ids": ids,
            "token_ids": out.ids,
            "logprobs": out.logprobs,
            "weight_version": out.version_end,
        }
        resp = ModelResponse(
            content=msg.get("content") or "",
            reasoning_content=msg.get("reasoning_content"),
            tool_calls=msg.get("tool_calls") or [],
            finish_reason=finish,
            usage=usage,
            raw=raw,
            latency_s=time.monotonic() - t0,
        )
        # The branch holds the message as the loop appends it, so the next call's messages compare equal.
        self.tito.record(branch, ids, out.ids, out.logprobs, out.version_start, out.version_end,
                         out.finish_reason, resp.message())  # fmt: skip
        return resp

    def complete(self, prompt_ids: list[int], seed: int | None = None) -> list[int]:
        """One call on raw prompt ids, no chat format (a completion task's prompt as its file gave it: the
        completion env's), sampled with `seed` (None: the session's) -> the sampled ids, recorded as a branch
        of their own."""
        if self.cancel_event.is_set():
            raise Cancelled("the RL run is stopping")
        branch = self.tito.raw(prompt_ids)
        out = self._generate(list(prompt_ids), seed)
        self.tito.record(branch, list(prompt_ids), out.ids, out.logprobs, out.version_start, out.version_end,
                         out.finish_reason, {"role": "assistant", "content": ""})  # fmt: skip
        return list(out.ids)

    def _generate(self, ids: list[int], seed: int | None = None):
        """The rollout server's sample for `ids`, seeded by `seed`, else by (run seed, session, call number)."""
        if seed is None:
            key = f"{self.seed}:{self.session}:{len(self.tito.calls)}".encode()
            seed = int.from_bytes(hashlib.sha256(key).digest()[:4], "little") & 0x7FFFFFFF  # stable across processes
        try:
            return self.server.generate(ids, GenParams(self.max_new_tokens, self.temperature, seed), self.session)
        except Exception as e:  # noqa: BLE001 - the run stops on it, whatever the agent loop does with it
            self.failure = e if isinstance(e, ServerFailure) else ServerFailure(f"the rollout server failed: {e}")
            raise self.failure from e
