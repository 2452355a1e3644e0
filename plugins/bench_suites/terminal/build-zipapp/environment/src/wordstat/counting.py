def counts(text: str) -> tuple[int, int, int]:
    """Lines, words and characters of `text`, as `wc` counts them."""
    return text.count("\n"), len(text.split()), len(text)
