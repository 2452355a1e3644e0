"""Incremental detokenization and stop strings, against the whole-text answers they must agree with."""

from __future__ import annotations

import random

from model.tokenizer import Tokenizer
from serve.http.detokenizer import IncrementalDetokenizer, StopStrings


def test_incremental_equals_whole_decode_across_multibyte_characters():
    tok = Tokenizer.shipped()
    text = "naïve café — 北京 🙂 done <think>x</think>"
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok)
    pieces = [d.add([t]) for t in ids] + [d.flush()]
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)  # a character split over byte tokens arrives whole


def test_skipped_ids_never_reach_the_text():
    tok = Tokenizer.shipped()
    eos = tok.eos_token_ids[0]
    d = IncrementalDetokenizer(tok, skip_ids=[eos])
    ids = tok.encode("hello") + [eos]
    assert "".join(d.add([t]) for t in ids) + d.flush() == "hello"


def test_stop_strings_in_any_chunking_equal_the_whole_text_cut():
    text = "abc STOP def"
    rng = random.Random(0)
    for _ in range(50):
        s = StopStrings(["STOP", "xyz"])
        cuts = sorted(rng.sample(range(1, len(text)), 4))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        out = "".join(s.feed(c) for c in chunks)
        assert out == "abc " and s.hit == "STOP"
    s = StopStrings(["STOP"])
    assert s.feed("abc ST") == "abc " and s.feed("x") == "STx" and s.hit is None
    assert s.feed("S") == "" and s.flush() == "S"  # a held tail is released at the end
    assert StopStrings([]).feed("anything") == "anything"
