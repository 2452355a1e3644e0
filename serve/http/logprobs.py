"""Token logprobs in the two OpenAI wire formats.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}]}`.
Completions (legacy): `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.
Token strings are each id decoded alone; `bytes` is that string's UTF-8 (a byte-level piece of a multi-byte
character decodes to U+FFFD alone, as in vLLM).
"""

from __future__ import annotations

import math

# OpenAI's logprob for a token of probability 0. JSON has no -Infinity or NaN: a non-finite logprob (a masked
# token in the top-n, a degenerate row) must not reach the client as one, nor fail the response.
FLOOR = -9999.0


def finite(logprob) -> float:
    lp = float(logprob)
    return lp if math.isfinite(lp) else FLOOR


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer, entries, top_n: int) -> dict:
    content = []
    for e in entries:
        tok = token_text(tokenizer, e.token_id)
        top = sorted((e.top or {}).items(), key=lambda kv: -kv[1])[:top_n]
        content.append(
            {
                "token": tok,
                "logprob": finite(e.logprob),
                "bytes": list(tok.encode()),
                "top_logprobs": [
                    {"token": (t := token_text(tokenizer, tid)), "logprob": finite(lp), "bytes": list(t.encode())}
                    for tid, lp in top
                ],
            }
        )
    return {"content": content}


def completion_logprobs(tokenizer, entries, top_n: int, offset: int = 0) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    pos = offset
    for e in entries:
        tok = token_text(tokenizer, e.token_id)
        tokens.append(tok)
        lps.append(finite(e.logprob))
        top = sorted((e.top or {}).items(), key=lambda kv: -kv[1])[:top_n]
        tops.append({token_text(tokenizer, tid): finite(lp) for tid, lp in top} if top_n else None)
        offsets.append(pos)
        pos += len(tok)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
