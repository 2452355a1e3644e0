"""The GLM-5 network and its files. Knows nothing of serving or training.

Module map (filled in as the model lands):
- special_tokens.py  the GLM-5 special tokens and their ids in glm5's shipped tokenizer
- tokenizer.py       loads tokenizer.json (a checkpoint's or the shipped one), special ids by name; writes the
                     tokenizer files of a new checkpoint (save_tokenizer_files)
- chat.py            renders OpenAI messages in the GLM-5 chat format: text, ids, ids + loss masks for training
- chat_parse.py      parses GLM-5 completions into reasoning, content and tool calls; whole or streamed
- assets/            the shipped tokenizer.json (scripts/train_tokenizer.py) and chat_template.jinja

A chat request: chat.render -> tokenizer.encode -> (the network generates) -> chat_parse.StreamParser.feed per
decoded delta -> OpenAI deltas; a stored trajectory: chat.render_for_training -> ids, message index, loss mask.
"""
