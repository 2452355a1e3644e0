"""The GLM-5 network and its files. Knows nothing of serving or training.

Module map (filled in as the model lands):
- special_tokens.py  the GLM-5 special tokens and their ids in glm5's shipped tokenizer
"""
