"""wordstat: line, word and character counts of text files."""
