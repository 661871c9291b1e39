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
import textwrap

from scalelab.errors import UsageError, printable

# A store or --out that cannot be written: one line naming the file, as for bad input (no traceback).
_UNWRITABLE = {
    errno.ENOSPC: "free some space or choose another --out",
    errno.EDQUOT: "free some of the quota or choose another --out",
    errno.EROFS: "the file system is read-only; choose another --out",
    errno.EACCES: "check its permissions or choose another --out",
    errno.EPERM: "check its permissions or choose another --out",
}


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions: prose paragraphs wrapped to the terminal, a paragraph with indented lines (examples,
    usage) kept as written. An option's default is stated after its help unless the help already says
    it (or there is none: a flag, or an option that is off unless given)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.strip("\n").split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                words = " ".join(line.strip() for line in lines)
                paragraphs.append(textwrap.fill(words, width, initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default in ("", [])
        if not action.option_strings or unset or action.default is argparse.SUPPRESS or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


class SubcommandParsers(argparse._SubParsersAction):
    """`add_parser(name, help=...)` with no description gets its help line as one: every `--help` says
    what the command does."""

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        if kwargs.get("help") and not kwargs.get("description"):
            kwargs["description"] = kwargs["help"][0].upper() + kwargs["help"][1:] + "."
        return super().add_parser(name, **kwargs)


class Parser(argparse.ArgumentParser):
    """The `scalelab` parser and every subcommand's (argparse builds those with the parent's class)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", SubcommandParsers)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="scalelab",
        description="Scaling-law experiments for LLM pretraining: sweeps of runs on Ray, fits with their "
        "intervals, the next round, the plan of the big run. `scalelab demo` runs the whole loop on a CPU; "
        "`scalelab COMMAND --help` describes each command.",
    )
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
