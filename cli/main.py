"""The `scalelab` command line.

Each subcommand lives in its own module under cli/ and registers itself with `add_parser(sub)`
and a `run(args) -> int`. Bad input raises `ConfigError` (or `UsageError`), which becomes one line on
stderr and exit code 2 — never a traceback; so does a file that cannot be written (a full disk, a
read-only store, no permission).

    scalelab --help
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from scalelab.errors import UsageError, printable

# A store or --out that cannot be written: one line naming the file, as for bad input (no traceback).
_UNWRITABLE = {
    errno.ENOSPC: "free some space or choose another --out",
    errno.EDQUOT: "free some of the quota or choose another --out",
    errno.EROFS: "the file system is read-only; choose another --out",
    errno.EACCES: "check its permissions or choose another --out",
    errno.EPERM: "check its permissions or choose another --out",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalelab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, _ in _command_modules():
        mod = importlib.import_module(f"scalelab.cli.{module_name}")
        mod.add_parser(sub)
    return parser


def _command_modules() -> list[tuple[str, str]]:
    from scalelab.cli import commands

    return list(commands.COMMANDS)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(printable(f"scalelab {args.command}: error: {e}"), file=sys.stderr)  # values from records
        return 2
    except OSError as e:
        if e.errno not in _UNWRITABLE:
            raise
        where = e.filename or "a file"
        print(
            printable(f"scalelab {args.command}: error: {where}: {e.strerror}; {_UNWRITABLE[e.errno]}"),
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
