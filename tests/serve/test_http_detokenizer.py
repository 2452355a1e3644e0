"""Incremental detokenization and stop strings, against the whole-text answers they must agree with."""

from __future__ import annotations

import random

from model.tokenizer import Tokenizer
from serve.engine.detokenizer import IncrementalDetokenizer, StopStrings


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


CORPUS = [
    "naïve café — 北京 🙂 done <think>x</think>",
    "emoji joiners 👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, combining e\u0301 and a\u030a",
    "def f(x):\n    return x  # 日本語のコメント\n\n\tindented\r\nwindows",
    "<tool_call>edit<arg_key>path</arg_key><arg_value>ü.py</arg_value></tool_call><|observation|>",
    "Ελληνικά, русский, עברית, العربية, हिन्दी, 한국어 — mixed scripts",
    "    lots   of   spaces    and trailing   ",
]


def chunked(ids, rng):
    out, i = [], 0
    while i < len(ids):
        k = rng.choice([1, 1, 1, 2, 3])
        out.append(ids[i : i + k])
        i += k
    return out


def run(detok, chunks, stops):
    s = StopStrings(stops)
    deltas = [detok.add(c) for c in chunks] + [detok.flush()]
    return deltas, [s.feed(d) for d in deltas] + [s.flush()], s.hit


def test_decode_stream_gives_what_the_window_reference_gives_token_by_token():
    """The same deltas, step by step, as the plain window decoder -- on real text, on random ids (which
    split characters and make invalid UTF-8), with several tokens in one step (speculative decoding), eos
    skipped, and stop strings cut from the result."""
    from serve.engine.detokenizer import StreamDetokenizer, WindowDetokenizer

    tok = Tokenizer.shipped()
    rng = random.Random(0)
    eos = tok.eos_token_ids[0]
    cases = [tok.encode(t) for t in CORPUS]
    cases += [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 60))] for _ in range(200)]
    for ids in cases:
        ids = ids + ([eos] if rng.random() < 0.3 else [])
        chunks = chunked(ids, rng)
        text = tok.decode([t for t in ids if t != eos])
        stops = [text[a : a + rng.randint(1, 4)] for a in rng.sample(range(len(text)), min(2, len(text)))]
        stream = StreamDetokenizer(tok, tok._tok, skip_ids=[eos])
        assert isinstance(IncrementalDetokenizer(tok), StreamDetokenizer)
        want = run(WindowDetokenizer(tok, skip_ids=[eos]), chunks, stops)
        assert run(stream, chunks, stops) == want, ids
        assert "".join(want[0]) == text
