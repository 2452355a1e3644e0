"""Token ids -> text, incrementally, and stop strings cut out of that text.

Each served token is decoded here, once (the engine is asked for no text: `SamplingParams.detokenize=False`).
`IncrementalDetokenizer` feeds the ids to `tokenizers`' `DecodeStream`, which keeps its own window and holds
back text while the newest tokens end in an incomplete UTF-8 character, so a multi-byte character split over
two byte-level tokens reaches the client whole. `WindowDetokenizer` is the plain reference it is tested against
(vLLM's prefix/read offsets over `decode`, each call O(window)), and what a tokenizer without a `tokenizers`
backend gets.

`StopStrings` finds OpenAI `stop` sequences in the decoded text. The stop sequence itself is not returned, and a
tail that could still become one is held back until the next tokens decide, so a streamed client never sees the
beginning of a stop sequence that a non-streamed client would not.
"""

from __future__ import annotations

from collections.abc import Iterable


def IncrementalDetokenizer(tokenizer, skip_ids: Iterable[int] = ()):  # noqa: N802 - a class to its callers
    """A `StreamDetokenizer` over the tokenizer's `tokenizers` backend, or a `WindowDetokenizer` without one."""
    backend = getattr(tokenizer, "_tok", None)  # model.tokenizer.Tokenizer keeps its tokenizers.Tokenizer there
    if backend is not None and hasattr(backend, "decode_batch"):
        return StreamDetokenizer(tokenizer, backend, skip_ids)
    return WindowDetokenizer(tokenizer, skip_ids)


# Ids kept from before the held-back ones, so `flush` decodes them in context (byte-level BPE joins freely).
_FLUSH_CONTEXT = 8


class StreamDetokenizer:
    def __init__(self, tokenizer, backend, skip_ids: Iterable[int] = ()):
        from tokenizers.decoders import DecodeStream

        self.tokenizer, self.backend = tokenizer, backend
        self.skip_ids = frozenset(skip_ids)
        self.stream = DecodeStream(skip_special_tokens=False)
        self.context: list[int] = []  # the last ids whose text has been returned
        self.pending: list[int] = []  # ids fed since, whose text is held back

    def add(self, token_ids: Iterable[int]) -> str:
        """The text the new tokens complete (possibly empty while a character is still split)."""
        ids = [int(t) for t in token_ids if t not in self.skip_ids]
        if not ids:
            return ""
        text = self.stream.step(self.backend, ids)
        if text is None:
            self.pending += ids
            return ""
        self.context = (self.context + self.pending + ids)[-_FLUSH_CONTEXT:]
        self.pending = []
        return text

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end comes out as U+FFFD)."""
        if not self.pending:
            return ""
        prefix = self.tokenizer.decode(self.context)
        full = self.tokenizer.decode(self.context + self.pending)
        self.context, self.pending = (self.context + self.pending)[-_FLUSH_CONTEXT:], []
        return full[len(prefix) :]


class WindowDetokenizer:
    def __init__(self, tokenizer, skip_ids: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.skip_ids = frozenset(skip_ids)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_ids: Iterable[int]) -> str:
        """The text the new tokens complete (possibly empty while a character is still split)."""
        self.ids.extend(t for t in token_ids if t not in self.skip_ids)
        if len(self.ids) == self.read_offset:
            return ""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end comes out as U+FFFD)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :]


class StopStrings:
    def __init__(self, stops: Iterable[str]):
        self.stops = [s for s in stops if s]
        self.text = ""  # everything generated, cut at a stop sequence once one is found
        self.sent = 0  # how much of `text` has been released
        self.hit: str | None = None

    def feed(self, delta: str) -> str:
        """Text that is safe to release. After a stop sequence is found, `hit` is set and nothing more comes."""
        if self.hit is not None or not delta:
            return ""
        if not self.stops:
            self.text += delta
            self.sent = len(self.text)
            return delta
        self.text += delta
        # Every tail that could begin a stop sequence is held back, so a match can only start in unsent text.
        found = [(i, s) for s in self.stops if (i := self.text.find(s, self.sent)) != -1]
        if found:
            idx, stop = min(found)
            self.hit = stop
            self.text = self.text[:idx]
            out = self.text[self.sent :]
            self.sent = len(self.text)
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text) - self.sent), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        end = len(self.text) - hold
        out = self.text[self.sent : end]
        self.sent = end
        return out

    def flush(self) -> str:
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out
