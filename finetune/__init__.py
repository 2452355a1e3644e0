"""Fine-tuning: trajectories -> token ids + loss masks, SFT (LoRA / full), RL, distributed launch.

Module map:
- mtp_loss.py   mtp_loss (LM + GLM-5's chained MTP loss, loss masks, MTP-only mode) and the train_mtp loop
- mtp_align.py  align the MTP layer with its main model (its generations or recorded responses; MTP layer only),
                read prompt files, render trajectory samples, rank a draft vocabulary
- sft.py        LoRA (peft) SFT on recorded responses: add_lora, train_sft, save/load_adapter, merge_lora
- grpo.py       RL: GRPO + IcePop with on-policy rollouts from the embedded engine (train_grpo, grpo_backward)
"""
