"""Why a fine-tuning run cannot go on, as the commands report it: `RunError` (the run or its inputs cannot be
used: exit 1) and `UsageError` (what the user gave is wrong: a usage error, exit 2), each with the message and
a hint of what to do. The recipes raise them; glm5cli turns them into its error lines."""

from __future__ import annotations


class RunError(ValueError):
    """A run that cannot start or go on; `hint` says what to do. (Moved from finetune/run_dir.py.)"""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


class UsageError(RunError):
    """An option, a data file or a record that is wrong as given: the command's usage error."""
