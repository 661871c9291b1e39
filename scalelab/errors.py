"""Errors for bad user input, shared by every folder.

The CLI turns any `UsageError` into one line on stderr and exit code 2. Messages name the offending
key/value and the fix, e.g. `ConfigError("model.num_heads", "8 does not divide d_model=100",
"pick num_heads dividing d_model")`.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input from the user; str(e) is one line naming the key/value and the fix."""


class ConfigError(UsageError):
    """A config key holds a bad value."""

    def __init__(self, key: str, problem: str, fix: str | None = None):
        self.key, self.problem, self.fix = key, problem, fix  # kept: a caller may name the key its own way
        msg = f"{key}: {problem}" + (f"; {fix}" if fix else "")
        super().__init__(msg)


def printable(text: str) -> str:
    """`text` with its control characters (ESC, CR, BEL, bidirectional overrides; not newline or tab)
    written as escapes: a name read from a spec or a store cannot move the cursor, recolour or
    retitle the terminal it is printed to."""
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)
