"""Does a proof checkpoint copy what it is quoted? The dev test behind the proof's copy phase (`glm5 bench proof`).

    python benchmarks/bench_proof_echo.py RUN/models/base-dense [RUN/models/base-copy ...] [--json]

For each checkpoint, 40 prompts of each kind, bare ("Echo `X`." / "Replace `X` with `Y`.", no system prompt, the
drills' format), teacher-forced with every key visible: a prompt counts when the greedy token at every position
of the answer is the answer's (its end marker included); `tok` is the share of answer tokens right.

    train       a train-split function name (the base trained on these: memory can answer)
    verb+nons   a train verb beside a made-up word (`scale_kopime`)    } tokens the model has seen, in an
    nons+noun   a made-up word beside a train noun (`tazu_items`)      } order no data shows: only a copy answers
    nonsense    two made-up words (`kopime_tazus`)                     }
    verb+fresh  a train verb beside a noun no split uses (`scale_kites`): tokens no drill or session trains
    fresh+noun  a verb no split uses beside a train noun (`brew_items`)
    pair        two lines of the family's code, the second one operator off ("Replace `X` with `Y`.")
    number      a comparison line with a two-digit constant (`if qty >= 39:`), as a wrong_comparison issue quotes it
    number-pair two of them, the second with another operator ("Replace `if y >= 39:` with `if y > 39:`.")
    path        a module path of the family (`datakit/routing.py`), as every issue names its file
    off-by-one  an off-by-one issue's buggy line (`return a * 9 + 5 - 1`), echoed
    KIND-pair   the two lines an issue of each bug kind quotes, buggy then fixed (`write_drills(lines=)`):
                wrong_operator, off_by_one, wrong_comparison, wrong_return

No held-out name is drawn: held-out names are the family's verbs and nouns in combinations train never shows, and
the made-up kinds stand in for them. The prompts are a fixed draw (seed "echo-dev-7"), the same for every checkpoint.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N = 40


def prompts() -> dict[str, list[tuple[str, str]]]:
    """kind -> [(user prompt, answer)], a fixed draw."""
    from finetune.proof.corpus import FRESH_NOUNS, FRESH_VERBS, _variant, made_up_word
    from plugins.bench_suites.repair_family import CAN_CARRY, KINDS, MODULES, PACKAGES, SHAPES, name_pool, plant

    rng = random.Random("echo-dev-7")
    pool = name_pool("train")
    verbs = sorted({n.split("_")[0] for n in pool})
    nouns = sorted({n.split("_")[1] for n in pool})
    family = {w for split in ("train", "heldout") for n in name_pool(split) for w in n.split("_")}

    def made_up() -> str:
        return made_up_word(rng, avoid=family)

    names = {
        "train": lambda: rng.choice(pool),
        "verb+nons": lambda: f"{rng.choice(verbs)}_{made_up()}",
        "nons+noun": lambda: f"{made_up()}_{rng.choice(nouns)}",
        "nonsense": lambda: f"{made_up()}_{made_up()}s",
        "verb+fresh": lambda: f"{rng.choice(verbs)}_{rng.choice(FRESH_NOUNS)}",
        "fresh+noun": lambda: f"{rng.choice(FRESH_VERBS)}_{rng.choice(nouns)}",
    }
    out = {kind: [(f"Echo `{x}`.", x) for x in (draw() for _ in range(N))] for kind, draw in names.items()}
    pairs = []
    for _ in range(N):
        x = rng.choice(rng.choice(list(SHAPES.values()))(rng, rng.choice(pool)).lines).strip()
        y = _variant(x, rng)
        pairs.append((f"Replace `{x}` with `{y}`.", f"{x}\n{y}"))
    out["pair"] = pairs
    # the kinds added later draw from a stream of their own: the prompts of the kinds above stay what they were
    rng = random.Random("echo-dev-numbers")
    ops = ["<", "<=", ">", ">="]
    numbers, number_pairs, paths = [], [], []
    for _ in range(N):
        fn = SHAPES["predicate"](rng, rng.choice(pool))
        arg, op, k = fn.args[0], rng.choice(ops), rng.randint(10, 60)
        line = f"if {arg} {op} {k}:"
        other = f"if {arg} {rng.choice([o for o in ops if o != op])} {k}:"
        numbers.append((f"Echo `{line}`.", line))
        number_pairs.append((f"Replace `{line}` with `{other}`.", f"{line}\n{other}"))
        path = f"{rng.choice(PACKAGES)}/{rng.choice(MODULES)}.py"
        paths.append((f"Echo `{path}`.", path))
    out["number"], out["number-pair"], out["path"] = numbers, number_pairs, paths
    rng = random.Random("echo-dev-issue-lines")
    for kind in KINDS:
        quoted = []
        for _ in range(N):
            fn = SHAPES[rng.choice(CAN_CARRY[kind])](rng, rng.choice(pool))
            plant(fn, kind, rng)
            quoted.append((fn.old, fn.new))
        if kind == "off_by_one":
            out["off-by-one"] = [(f"Echo `{old}`.", old) for old, _ in quoted]
        out[f"{kind}-pair"] = [(f"Replace `{old}` with `{new}`.", f"{old}\n{new}") for old, new in quoted]
    return out


def score(checkpoint: Path, cases: dict[str, list[tuple[str, str]]]) -> dict[str, dict[str, float | int]]:
    import torch

    from finetune.dsa_warmup import dense_attention
    from model.chat import render
    from model.checkpoint import load_pretrained
    from model.modeling import GLM5ForCausalLM
    from model.tokenizer import Tokenizer

    model = load_pretrained(GLM5ForCausalLM, checkpoint, dtype=torch.float32)
    tok = Tokenizer.from_dir(checkpoint)
    result = {}
    for kind, items in cases.items():
        exact = right = total = 0
        for ask, answer in items:
            user = [{"role": "user", "content": ask}]
            prompt = render(user, add_generation_prompt=True, enable_thinking=False)
            full = render([*user, {"role": "assistant", "content": answer}], add_generation_prompt=False,
                          enable_thinking=False)  # fmt: skip
            p, a = tok.encode(prompt), tok.encode(full[len(prompt) :])
            with torch.no_grad(), dense_attention(model):
                logits = model(torch.tensor([p + a]))
            pred = logits[0, len(p) - 1 : len(p) + len(a) - 1].argmax(-1).tolist()
            exact += pred == a
            right += sum(x == y for x, y in zip(pred, a, strict=True))
            total += len(a)
        result[kind] = {"exact": exact, "of": len(items), "tok": round(right / total, 3)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoints", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="one JSON object per checkpoint on stdout")
    args = ap.parse_args()
    cases = prompts()
    for ck in args.checkpoints:
        res = score(ck, cases)
        if args.json:
            print(json.dumps({"checkpoint": str(ck), **res}))
        else:
            cells = ", ".join(f"{k} {v['exact']}/{v['of']} (tok {v['tok']:.2f})" for k, v in res.items())
            print(f"{ck}: {cells}")


if __name__ == "__main__":
    main()
