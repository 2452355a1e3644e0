"""glm5's SFT data for slime: the token ids and target masks exactly as `glm5 finetune sft` builds them (GLM-5's
chat format, recorded ids where the trajectory has them, denied / malformed / refused turns as context), written
as slime prompt rows, and the rollout function that hands them to slime's SFT loss unchanged.

slime's own SFT rollout (slime/rollout/sft_rollout.py) re-renders `messages` through a Hugging Face chat
template and computes its masks by template type; this one reads the ids and masks from the row, so slime trains
on the same tokens glm5 would.

    --rollout-function-path finetune.slime.sft.generate_rollout --prompt-data OUT/sft.jsonl
    --input-key prompt --metadata-key metadata --loss-type sft_loss --calculate-per-token-loss
    --disable-compute-advantages-and-returns --debug-train-only
"""

from __future__ import annotations

import json
from pathlib import Path

IDS_KEY, MASK_KEY = "glm5_tokens", "glm5_loss_mask"


def sft_rows(seqs: list[tuple[list[int], list[bool]]]) -> list[dict]:
    """One row per sequence that has a target: the ids and the 0/1 target mask (mask[t]: token t is trained)."""
    return [{"prompt": "", "metadata": {IDS_KEY: list(ids), MASK_KEY: [int(m) for m in mask]}}
            for ids, mask in seqs if any(mask)]  # fmt: skip


def write_sft_data(seqs, path: Path) -> int:
    rows = sft_rows(seqs)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def fill_sample(sample) -> None:
    """Set a slime Sample's tokens, response_length (from the first target on) and loss_mask from its row."""
    meta = sample.metadata or {}
    ids, mask = meta.get(IDS_KEY), meta.get(MASK_KEY)
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask) or 1 not in mask:
        raise ValueError(f"an SFT row needs metadata.{IDS_KEY} and metadata.{MASK_KEY} of one length with a target "
                         "(`glm5 finetune sft --export-slime` writes them)")  # fmt: skip
    start = mask.index(1)
    sample.tokens, sample.response_length = list(ids), len(ids) - start
    sample.loss_mask, sample.reward = list(mask[start:]), 0


def generate_rollout(args, rollout_id, data_buffer, evaluation=False):
    """slime's rollout-function hook for SFT: the next `rollout_batch_size` rows, filled from their metadata."""
    if evaluation:
        raise ValueError("finetune.slime.sft has no evaluation rollout")
    samples = data_buffer.get_samples(args.rollout_batch_size)
    for group in samples:
        for sample in group:
            fill_sample(sample)
    return samples
