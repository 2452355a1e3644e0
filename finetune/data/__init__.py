"""Readers of training data; they know the file formats and the chat format, nothing of models or training.

Module map:
- sources.py        load_sequences: any paths -> TrainSequences + DataReport (the format told from the content)
- sequences.py      Call / Session / TrainSequence; one sequence per session branch, masks from model/chat.py,
                    recorded token ids (TITO) where every call has them, no end token after a truncated turn
- trajectories.py   glm5 trajectories and `glm5 bench` run folders (outcome filters), DataOptions; also the
                    per-call view align-mtp trains on (sample_sequences, recorded_sequences); files_of (a file,
                    or a folder's files)
- openai_chat.py    OpenAI chat JSONL ({messages, tools}; `weight: 0`) and mini-swe-agent .traj.json
- harbor.py         Harbor trial trajectories (ATIF v1.x; prompt/completion token ids since v1.3/1.4)
- report.py         DataReport (what was used, what each filter left out, skipped records by file:line), BadRecord
- jsonl.py          JSON / JSONL files as untrusted input: each value with its line, or why it cannot be read
                    (the one wording of "not JSON" every reader reports)
- batches.py        token_batches (random windows of a stream), padded_batches (shuffled (ids, mask) batches)
- packing.py        pack / packed_batches: rows of whole sequences with their own positions and segment ids
- prompts.py        read_prompt_rows: prompt JSONL -> token ids (align-mtp's prompts, RL's tasks)
"""
