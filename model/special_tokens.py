"""GLM-5's special tokens, and where they sit in the tokenizer glm5 ships.

Real GLM-5 puts its special tokens after the BPE vocabulary, from id 154820 (`<|endoftext|>`) on.
glm5's own small tokenizer (for the `tiny` / `small` presets) keeps the same order and the same
offsets from a base id, so code that works on one works on the other. Code must look ids up by name
in the loaded tokenizer (`tokenizer.token_to_id`), never hard-code them: a real GLM-5
`tokenizer.json` has other ids.
"""

from __future__ import annotations

# Offsets from the first special id, as in GLM-5 (154820 + offset). Slots GLM-5 uses for tokens
# glm5 does not need (image, video, audio markers, ...) are filled with `<|reserved_N|>`.
GLM5_SPECIAL_OFFSETS: dict[str, int] = {
    "<|endoftext|>": 0,
    "[MASK]": 1,
    "[gMASK]": 2,
    "[sMASK]": 3,
    "<sop>": 4,
    "<eop>": 5,
    "<|system|>": 6,
    "<|user|>": 7,
    "<|assistant|>": 8,
    "<|observation|>": 9,
    "<think>": 21,
    "</think>": 22,
    "<tool_call>": 23,
    "</tool_call>": 24,
    "<tool_response>": 25,  # inferred from GLM-4.5's layout; not verified for GLM-5
    "</tool_response>": 26,
    "<arg_key>": 27,
    "</arg_key>": 28,
    "<arg_value>": 29,
    "</arg_value>": 30,
}

GLM5_SPECIAL_BASE = 154820  # id of <|endoftext|> in the real GLM-5 tokenizer

# glm5's shipped tokenizer: 8192 ids in all, the last 64 reserved for special tokens.
SHIPPED_VOCAB_SIZE = 8192
SHIPPED_NUM_SPECIAL = 64
SHIPPED_SPECIAL_BASE = SHIPPED_VOCAB_SIZE - SHIPPED_NUM_SPECIAL  # 8128

# Tokens that end a generation, as GLM-5's config.json lists them.
EOS_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
PAD_TOKEN = "<|endoftext|>"


def shipped_special_tokens() -> list[tuple[str, int]]:
    """All 64 special tokens of the shipped tokenizer as (content, id), reserved slots included."""
    by_offset = {off: tok for tok, off in GLM5_SPECIAL_OFFSETS.items()}
    return [(by_offset.get(i, f"<|reserved_{i}|>"), SHIPPED_SPECIAL_BASE + i) for i in range(SHIPPED_NUM_SPECIAL)]


def shipped_id(token: str) -> int:
    """Id of a named special token in the shipped tokenizer."""
    return SHIPPED_SPECIAL_BASE + GLM5_SPECIAL_OFFSETS[token]


SHIPPED_EOS_IDS = [shipped_id(t) for t in EOS_TOKENS]
SHIPPED_PAD_ID = shipped_id(PAD_TOKEN)
