"""Token ids -> text, incrementally, and stop strings cut out of that text: the one text path of serve.

`Detokenizer` is one request's text, used by the engine (`SamplingParams.detokenize`, its `stop` strings) and by
the HTTP app (serve/http/generation.py asks the engine for no text and decodes the ids of whatever engine it
serves with this same class). It joins the two pieces below.

`IncrementalDetokenizer` feeds the ids to `tokenizers`' `DecodeStream`, which keeps its own window and holds
back text while the newest tokens end in an incomplete UTF-8 character, so a multi-byte character split over
two byte-level tokens comes out whole. `WindowDetokenizer` is the plain reference it is tested against
(vLLM's prefix/read offsets over `decode`, each call O(window)), and what a tokenizer without a `tokenizers`
backend gets. Either can start from a few ids of context (the engine's: the end of the prompt), whose text is
not returned.

`StopStrings` finds stop sequences in the decoded text. The stop sequence itself is not returned (unless asked:
`include`), and a tail that could still become one is held back until the next tokens decide, so a streamed
client never sees the beginning of a stop sequence that a non-streamed client would not. Of two matches the
earliest wins, and of two at the same place the shorter (the one a token-by-token stream completes first).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers.decoders import DecodeStream

# How many prompt tokens the engine decodes along with the output, so word-boundary effects are right.
_CONTEXT_TOKENS = 6


class Detokenizer:
    """One request's text, grown token by token, with its stop strings cut. Knows its tokenizer, not the engine.

    `add` / `flush` return the text that is safe to release; `text` is everything so far (held-back text
    included, cut at a stop string once one is found); `stop` is the stop string found, or None."""

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        *,
        skip_ids: Iterable[int] = (),
        stops: Iterable[str] = (),
        include_stop: bool = False,
    ):
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:]) if prompt_token_ids else []
        self.decoder = IncrementalDetokenizer(tokenizer, skip_ids, skip_special_tokens, context)
        self.stops = StopStrings(stops, include_stop)

    @property
    def text(self) -> str:
        return self.stops.text

    @property
    def stop(self) -> str | None:
        return self.stops.hit

    def add(self, token_ids: Iterable[int]) -> str:
        """The text the new tokens complete, less a stop string and what could still begin one."""
        return self.stops.feed(self.decoder.add(token_ids))

    def flush(self) -> str:
        """At the end of a request: whatever is left (an incomplete character at the very end as U+FFFD)."""
        text = self.stops.feed(self.decoder.flush())
        return text + (self.stops.flush() if self.stops.hit is None else "")


def IncrementalDetokenizer(  # noqa: N802 - a class to its callers
    tokenizer, skip_ids: Iterable[int] = (), skip_special_tokens: bool = False, context: Sequence[int] = ()
):
    """A `StreamDetokenizer` over the tokenizer's `tokenizers` backend, or a `WindowDetokenizer` without one."""
    backend = getattr(tokenizer, "_tok", None)  # model.tokenizer.Tokenizer keeps its tokenizers.Tokenizer there
    if backend is not None and hasattr(backend, "decode_batch"):
        return StreamDetokenizer(tokenizer, backend, skip_ids, skip_special_tokens, context)
    return WindowDetokenizer(tokenizer, skip_ids, skip_special_tokens, context)


def _decoder(tokenizer, skip_special_tokens: bool):
    """`decode(ids)`, skipping special tokens when asked (a tokenizer's decode need not take the keyword else)."""
    if skip_special_tokens:
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    return tokenizer.decode


# Ids kept from before the held-back ones, so `flush` decodes them in context (byte-level BPE joins freely).
_FLUSH_CONTEXT = 8


class StreamDetokenizer:
    def __init__(
        self,
        tokenizer,
        backend,
        skip_ids: Iterable[int] = (),
        skip_special_tokens: bool = False,
        context: Sequence[int] = (),
    ):
        self.decode = _decoder(tokenizer, skip_special_tokens)
        self.backend = backend
        self.skip_ids = frozenset(skip_ids)
        self.context: list[int] = []  # the last ids whose text has been returned
        self.pending: list[int] = []  # ids fed since, whose text is held back
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        if context:
            self._start_from([int(t) for t in context])

    def _start_from(self, context: list[int]) -> None:
        """Feed the context, returning none of its text. A character it ends inside of is held back, as any
        split character is: it comes out whole with the tokens that complete it."""
        whole = len(context)
        while whole and self.decode(context[:whole]).endswith("\ufffd"):
            whole -= 1
        if whole:
            self.stream.step(self.backend, context[:whole])
        if whole < len(context):
            self.stream.step(self.backend, context[whole:])
        self.context, self.pending = context[:whole][-_FLUSH_CONTEXT:], context[whole:]

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
        prefix = self.decode(self.context)
        full = self.decode(self.context + self.pending)
        self.context, self.pending = (self.context + self.pending)[-_FLUSH_CONTEXT:], []
        return full[len(prefix) :]


class WindowDetokenizer:
    def __init__(
        self, tokenizer, skip_ids: Iterable[int] = (), skip_special_tokens: bool = False, context: Sequence[int] = ()
    ):
        self.decode = _decoder(tokenizer, skip_special_tokens)
        self.skip_ids = frozenset(skip_ids)
        self.ids: list[int] = list(context)  # the context's text is the first prefix, never returned
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        while self.read_offset and self.decode(self.ids[: self.read_offset]).endswith("\ufffd"):
            self.read_offset -= 1  # a character the context ends inside of comes out whole, as StreamDetokenizer's

    def add(self, token_ids: Iterable[int]) -> str:
        """The text the new tokens complete (possibly empty while a character is still split)."""
        self.ids.extend(t for t in token_ids if t not in self.skip_ids)
        if len(self.ids) == self.read_offset:
            return ""
        prefix = self.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end comes out as U+FFFD)."""
        prefix = self.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :]


class StopStrings:
    def __init__(self, stops: Iterable[str], include: bool = False):
        self.stops = [s for s in stops if s]
        self.include = include  # the stop sequence is part of the text (vLLM's include_stop_str_in_output)
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
            self.text = self.text[: idx + len(stop)] if self.include else self.text[:idx]
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
