"""Fine-tuning: trajectories -> token ids + loss masks, SFT (LoRA / full), RL, distributed launch."""
