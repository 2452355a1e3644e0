"""Incremental detokenisation and stop strings.

Decoding one token at a time does not work for byte-level BPE: a character can span tokens, and a
token's text can depend on its neighbours. As vLLM does, each step decodes a short window of recent
tokens twice, without and with the new ones (`prefix_offset` .. `read_offset` .. end), and emits the
difference; while the new text ends in U+FFFD (an incomplete UTF-8 sequence) it waits for more tokens.
Stop strings are searched in the text so far, only over the part that the new text can complete.
"""

from __future__ import annotations

# How many already-read tokens to decode along with the new ones, so word-boundary effects are right.
_CONTEXT_TOKENS = 6


class Detokenizer:
    """Text of one request's output, grown token by token. Knows its tokenizer, not the engine."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> str:
        """Append output tokens; return the new text they complete (may be empty)."""
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        new = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += new
        return new

    def flush(self) -> str:
        """At the end of a request: whatever is left, even an incomplete character."""
        full = self._decode(self.ids[self.prefix_offset :])
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new = full[len(prefix) :] if full.startswith(prefix) else ""
        self.read_offset = len(self.ids)
        self.text += new
        return new

    def find_stop(self, stops: tuple[str, ...], new_len: int, include: bool) -> str | None:
        """If a stop string now occurs in the text, cut the text there (after it when `include`) and
        return the stop string. Only the last `new_len + len(stop) - 1` characters can hold a new match."""
        best: tuple[int, str] | None = None
        for stop in stops:
            start = max(0, len(self.text) - new_len - len(stop) + 1)
            at = self.text.find(stop, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return None
        at, stop = best
        self.text = self.text[: at + len(stop)] if include else self.text[:at]
        return stop
