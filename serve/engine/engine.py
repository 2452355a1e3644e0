"""The engine loop: `step()` = schedule -> run the model -> postprocess (tokens, stop rules, text).

The engine owns the scheduler, the block manager and the model runner, turns prompts into sequences,
and turns sequences into `RequestOutput`s. It is synchronous and single-threaded; `LLM` drives it to
completion for offline use, `AsyncLLM` runs it in a background thread for the server.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from serve.engine.block_manager import BlockManager
from serve.engine.config import EngineConfig
from serve.engine.detokenizer import Detokenizer
from serve.engine.model_runner import ModelRunner
from serve.engine.request_output import RequestOutput
from serve.engine.sampling_params import SamplingParams
from serve.engine.scheduler import Scheduler
from serve.engine.sequence import Sequence
from serve.engine.spec_decode import SpecModelRunner


@dataclass(frozen=True)
class EngineMetrics:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by live sequences
    prefix_cache_hit_rate: float  # prompt tokens found in the prefix cache / prompt tokens admitted
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_steps: int
    weights_version: int
    # Speculative decoding (None when off): mean tokens emitted per verifying sequence-step (accepted drafts
    # + 1) and the fraction of drafted tokens accepted.
    spec_mean_acceptance_length: float | None = None
    spec_acceptance_rate: float | None = None
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0


class _Request:
    __slots__ = ("seq", "detok", "num_emitted")

    def __init__(self, seq: Sequence, detok: Detokenizer | None):
        self.seq, self.detok = seq, detok
        self.num_emitted = 0  # output tokens already passed to the detokenizer


class LLMEngine:
    def __init__(self, model, tokenizer=None, config: EngineConfig | None = None, device: str = "cpu"):
        self.config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        if self.config.speculative == "mtp":
            self.runner = SpecModelRunner(model, self.config, device)
        else:
            self.runner = ModelRunner(model, self.config, device)
        kv = self.runner.kv
        cfg = model.config
        max_len = self.config.max_model_len or min(cfg.max_position_embeddings, kv.num_blocks * kv.block_size)
        if tokenizer is not None and getattr(tokenizer, "eos_token_ids", None):
            eos = tuple(tokenizer.eos_token_ids)
        else:
            eos = cfg.eos_ids
        self.block_manager = BlockManager(kv.num_blocks, kv.block_size, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            eos_token_ids=eos,
            max_model_len=max_len,
            num_lookahead_slots=self.config.num_draft_tokens if self.config.speculative else 0,
        )
        self.max_model_len = max_len
        if self.config.speculative:
            self.runner.max_model_len = max_len
        self.requests: dict[str, _Request] = {}
        self.weights_version = 0
        self._arrival = itertools.count()
        self._ids = itertools.count()
        self._prompt_tokens = self._generation_tokens = self._steps = 0

    # ---- requests ---------------------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None):
        """Queue a request; it joins the running batch at the next step. Returns its id."""
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: give prompts as token id lists")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {request_id!r}: token id {bad[0]} is outside the vocabulary (size {vocab})")
        seq = Sequence(request_id, ids, params, arrival=next(self._arrival))
        self.scheduler.add(seq)  # raises if the prompt cannot fit
        detok = None  # params.detokenize=False: the caller decodes the tokens itself (the HTTP app does)
        if self.tokenizer is not None and params.detokenize:
            detok = Detokenizer(
                self.tokenizer, ids, params.skip_special_tokens, stops=params.stop,
                include_stop=params.include_stop_str_in_output,
            )  # fmt: skip
        self.requests[request_id] = _Request(seq, detok)
        self._prompt_tokens += len(ids)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; None if it is unknown or already finished."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.abort(request_id)
        return self._output(req)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    # ---- the loop ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One forward pass. Returns an output for every request that got a token or finished."""
        chunks = self.scheduler.schedule()
        sampled = self.runner.run(chunks)
        self._steps += 1
        updated = self.scheduler.postprocess(chunks, sampled)
        for seq in updated:
            req = self.requests[seq.request_id]
            # One token per step, or several when speculative decoding accepted drafts: text and stop strings
            # go token by token, so a stop string ends the output where one-token decoding would have.
            new_ids = seq.output_token_ids[req.num_emitted :]
            before = req.num_emitted
            # A stop token (EOS, stop_token_ids) ends the run and adds no text.
            stopped_by_token = seq.is_finished and isinstance(seq.stop_reason, int)
            for j, tok in enumerate(new_ids):
                req.num_emitted += 1
                if req.detok is None:
                    continue
                last = j == len(new_ids) - 1
                if not (last and stopped_by_token):
                    req.detok.add([tok])
                if last and seq.is_finished:
                    req.detok.flush()
                stop = req.detok.stop
                if stop is not None:
                    if seq.is_finished:  # EOS / max_tokens came with the same token: the stop string wins
                        seq.finish_reason, seq.stop_reason = "stop", stop
                    else:
                        self.scheduler.finish(seq, "stop", stop)
                    if not last:  # drop the accepted tokens after the stop string
                        del seq.token_ids[seq.num_prompt_tokens + req.num_emitted :]
                        del seq.logprobs[req.num_emitted :]
                    break
            self._generation_tokens += req.num_emitted - before
        outputs = []
        got_token = {s.request_id for s in updated}
        for rid, req in list(self.requests.items()):
            if rid in got_token or req.seq.is_finished:
                outputs.append(self._output(req))
            if req.seq.is_finished:
                del self.requests[rid]
        return outputs

    def _output(self, req: _Request) -> RequestOutput:
        s = req.seq
        return RequestOutput(
            request_id=s.request_id,
            prompt_token_ids=s.prompt_token_ids,
            token_ids=s.output_token_ids,
            text=req.detok.text if req.detok is not None else "",
            logprobs=list(s.logprobs),
            finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
            num_cached_tokens=s.num_cached_tokens,
            weights_version=self.weights_version,
        )

    # ---- weights and metrics ------------------------------------------------------------------------

    def update_weights(self, state_dict: dict, low_rank: dict | None = None) -> int:
        """Load new weights in place (RL swaps policies between rollouts) and bump `weights_version`.
        `low_rank`: INT4 layer name -> an adapter's (A, scaled B) to serve beside its int4 weight, or None to
        remove one (`Int4Linear.set_low_rank`).

        The prefix cache is dropped: its entries were computed by the old weights. Running requests
        keep their KV entries; a caller that needs clean on-policy rollouts swaps between batches."""
        missing = set(state_dict) - set(self.model.state_dict())
        if missing:
            raise KeyError(f"update_weights: not parameters or buffers of the model: {sorted(missing)[:5]}")
        mods = {name: self.model.get_submodule(name) for name in low_rank or {}}
        bad = [n for n, m in mods.items() if not hasattr(m, "set_low_rank")]
        if bad:
            raise KeyError(f"update_weights: not INT4 layers of the model: {bad[:5]}")
        self.model.load_state_dict(state_dict, strict=False)
        for name, factors in (low_rank or {}).items():
            mods[name].set_low_rank(*(factors or (None,)))
        return self.weights_changed()

    def weights_changed(self) -> int:
        """The model's weights were changed in place (an optimizer step on the model this engine serves, as in
        finetune/rl's synchronous run): drop the prefix cache, whose entries the old weights computed, and bump
        `weights_version`. The next forward reads the new values (the fast path's fused weights alias the
        model's parameters; `FusedLayer.is_current` re-fuses if a tensor was replaced)."""
        self.block_manager.reset_prefix_cache()
        self.weights_version += 1
        return self.weights_version

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.block_manager.usage,
            prefix_cache_hit_rate=self.block_manager.prefix_hit_rate,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._generation_tokens,
            num_steps=self._steps,
            weights_version=self.weights_version,
            **self._spec_metrics(),
        )

    def _spec_metrics(self) -> dict:
        m = getattr(self.runner, "spec_metrics", None)
        if m is None:
            return {}
        return dict(
            spec_mean_acceptance_length=m.mean_acceptance_length,
            spec_acceptance_rate=m.acceptance_rate,
            spec_draft_tokens_total=m.num_draft_tokens,
            spec_accepted_tokens_total=m.num_accepted_tokens,
        )
