"""Readers of training data; they know the file formats and the chat format, nothing of models or training.

Module map:
- batches.py        token_batches (random windows of a stream), padded_batches (shuffled (ids, mask) batches)
- prompts.py        read_prompt_rows: prompt JSONL -> token ids (align-mtp's prompts, RL's tasks)
- trajectories.py   glm5 trajectories -> (ids, prompt length) sequences; trajectory_files, truncated
"""
