"""Errors for bad user input, shared by every folder.

The CLI turns any `UsageError` into one line on stderr and exit code 2. Messages name the offending
key/value and the fix, e.g. `ConfigError("model.num_heads", "8 does not divide d_model=100",
"pick num_heads dividing d_model")`. A script outside the CLI (an experiment, a bench) does the same
through `run_script`:

    if __name__ == "__main__":
        run_script(main, __file__)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


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


def run_script(main: Callable[[], int | None], script: str) -> NoReturn:
    """Run a script's `main()` and exit with its code (None: 0); bad input (a UsageError, a ConfigError
    among them) exits 2 with one line on stderr, `NAME.py: error: KEY: PROBLEM; FIX`, not a traceback.

    Args:
        main: the script's entry; it reads its arguments from sys.argv (argparse's own errors are
            already one line and exit 2).
        script: the script's path (`__file__`), named in the error line.
    """
    try:
        code = main()
    except UsageError as e:
        print(printable(f"{Path(script).name}: error: {e}"), file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(code or 0)
