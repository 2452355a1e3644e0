"""Fine-tuning: trajectories -> token ids + loss masks, SFT (LoRA / full), MTP alignment, RL.

Module map:
- train_loop.py      the explicit loop every recipe runs (forward -> loss -> backward -> clip -> step), AdamW with
                     warm-up + cosine (OptimConfig), LossTerms, exact-resume training states
- mtp_objective.py   GLM-5's LM + chained MTP loss (mtp_loss: loss masks, MTP-only mode, self-distillation
                     targets) and train_mtp (MTPTrainConfig)
- mtp_align.py       align the MTP layer with its main model (its generations or recorded responses; MTP layer
                     only) and rank a draft vocabulary
- sft.py             supervised fine-tuning (SFTConfig, sft_loss, train_sft) on recorded responses
- lora.py            peft LoRA on GLM-5: add_lora, save/load_adapter, merge_lora
- run_dir.py         a resumable run's folder (.OUT.partial -> OUT, settings, data, checkpoints)
- data/              readers of training data: batches.py (token windows, padded batches), prompts.py (prompt
                     JSONL), trajectories.py (glm5 trajectories -> sequences)
- grpo.py            RL: GRPO + IcePop with on-policy rollouts from the embedded engine (train_grpo, grpo_backward)
- rl/                agentic RL: orchestrator -> buffer -> trainer -> weight push, sync or async (see rl/__init__.py)

The life of `glm5 finetune sft`: data/ reads the trajectories into (ids, target mask) sequences -> run_dir.py
opens (or resumes) the run folder -> lora.py adds adapters -> sft.train_sft runs train_loop.train on sft_loss,
checkpointing into the run folder -> lora.save_adapter writes OUT/adapter -> run_dir renames the folder to OUT.
"""
