"""Token ids -> text, incrementally, and stop strings cut out of that text.

`IncrementalDetokenizer` decodes a sliding window (vLLM's prefix/read offsets) so each call costs O(window), and
holds back text while the newest tokens end in an incomplete UTF-8 character (decoded as U+FFFD), so a
multi-byte character split over two byte-level tokens reaches the client whole.

`StopStrings` finds OpenAI `stop` sequences in the decoded text. The stop sequence itself is not returned, and a
tail that could still become one is held back until the next tokens decide, so a streamed client never sees the
beginning of a stop sequence that a non-streamed client would not.
"""

from __future__ import annotations

from collections.abc import Iterable


class IncrementalDetokenizer:
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
