"""Incremental detokenisation (multi-byte characters across tokens) and stop strings, end to end."""

from __future__ import annotations

from serve import LLM, SamplingParams
from serve.engine.detokenizer import Detokenizer
from tests.serve.engine.conftest import random_prompts


class ByteTokenizer:
    """A byte-level stand-in for the BPE tokenizer: id = byte value (ids >= 256 wrap). Characters outside
    ASCII span several tokens, as they do in byte-level BPE."""

    eos_token_ids = [8191]

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


class LetterTokenizer:
    """One lowercase letter per token id, so generated text is easy to cut."""

    eos_token_ids = [8191]

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_multibyte_characters_appear_whole():
    tok = ByteTokenizer()
    d = Detokenizer(tok, tok.encode("say: "))
    pieces = [d.add([b]) for b in "h€llo ✓".encode()]
    assert d.text == "h€llo ✓"
    assert "\ufffd" not in "".join(pieces)
    assert pieces[1:3] == ["", ""]  # the euro sign's first two bytes wait for the third


def test_stop_string_cuts_the_text_and_finishes(tiny_model):
    prompt = random_prompts([9], tiny_model.config.vocab_size, seed=11)[0]
    llm = LLM(tiny_model, tokenizer=LetterTokenizer(), num_kv_blocks=32, block_size=4)
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert len(free.text) == 12
    stop = free.text[5:7]
    cut = free.text.index(stop)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == free.text[:cut]
    assert len(out.token_ids) == cut + len(stop)  # generation stopped on the token that completed it
    kept = llm.generate(
        prompt,
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop], include_stop_str_in_output=True),
    )[0]
    assert kept.text == free.text[: cut + len(stop)]


def test_string_prompts_are_tokenised(tiny_model):
    llm = LLM(tiny_model, tokenizer=LetterTokenizer(), num_kv_blocks=32, block_size=4)
    out = llm.generate("hello", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))[0]
    assert out.prompt_token_ids == [7, 4, 11, 11, 14]


def test_prompt_context_gives_the_same_text_in_the_stream_and_the_window_decoder():
    """The engine decodes its output after the prompt's last tokens (word boundaries): DecodeStream primed with
    them gives what the window reference gives, a prompt that ends inside a character included (the character
    comes out whole with the output tokens that complete it)."""
    import random

    from model.tokenizer import Tokenizer
    from serve.engine.detokenizer import StreamDetokenizer, WindowDetokenizer

    tok, rng = Tokenizer.shipped(), random.Random(5)
    euro = tok.encode("a€b")
    for n in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(2, 40))] if n else euro * 3
        cut = rng.randint(1, len(ids) - 1)
        context, out, skip = ids[max(0, cut - 6) : cut], ids[cut:], rng.random() < 0.5
        stream = StreamDetokenizer(tok, tok._tok, (), skip, context)
        window = WindowDetokenizer(tok, (), skip, context)
        assert [stream.add([t]) for t in out] + [stream.flush()] == [window.add([t]) for t in out] + [window.flush()]
