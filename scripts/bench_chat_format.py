"""Time the chat format's hot paths on the test corpus: render, render_for_training, and the stream parser.

    python scripts/bench_chat_format.py

The server runs StreamParser.feed once per generated token per request, and fine-tuning runs
render_for_training once per stored conversation; both should cost far less than the model's own step.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from model.chat import render, render_completion, render_for_training  # noqa: E402
from model.chat_parse import StreamParser, parse  # noqa: E402
from model.tokenizer import Tokenizer  # noqa: E402
from tests.model.chat_corpus import CORPUS, NAMES, assistant_messages  # noqa: E402


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    tok = Tokenizer.shipped()
    _, msgs, tools = CORPUS[NAMES.index("long_agent_loop")]
    convo = msgs * 20
    rc = render_for_training(tok, convo, tools)
    dt = best_of(lambda: render(convo, tools))
    print(f"render               {len(convo)} messages, {len(render(convo, tools))} chars: {dt * 1e3:.2f} ms")
    dt = best_of(lambda: render_for_training(tok, convo, tools))
    print(f"render_for_training  {len(rc.ids)} tokens: {dt * 1e3:.1f} ms ({len(rc.ids) / dt / 1e3:.0f}k tokens/s)")

    texts = [render_completion(m) + "<|observation|>" for _, _, m, _ in assistant_messages()] * 10
    pieces = [[tok.decode([i]) for i in tok.encode(t)] for t in texts]
    n = sum(map(len, pieces))

    def stream():
        for completion in pieces:
            p = StreamParser()
            for piece in completion:
                p.feed(piece)
            p.finish()

    dt = best_of(stream)
    print(f"StreamParser.feed    {len(texts)} completions, {n} token-sized deltas: {dt / n * 1e6:.1f} us per delta")
    dt = best_of(lambda: [parse(t) for t in texts])
    print(f"parse                {len(texts)} completions, {sum(map(len, texts))} chars: {dt * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
