"""Every command's `--help` says what it does and what each argument is, with its default; building the
parser (every command's start-up) loads none of the heavy packages; bad input to the commands that
read a saved fit exits before torch loads; `sweep study` on a sweep that is not a study says where
studies are described."""

import argparse
import json
import os
import subprocess
import sys

from scalelab.cli.main import HelpFormatter, build_parser, main

HEAVY = ("torch", "polars", "numpy", "scipy", "matplotlib", "statsmodels", "ray", "pyarrow")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("scalelab",), listed: str | None = "root"):
    """(command path, its parser, its line in the parent's command list) of the root and every subcommand."""
    yield path, parser, listed
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            lines = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name), lines.get(name))


def _arguments(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_every_command_has_a_description_and_every_argument_a_help_line():
    missing = []
    for path, parser, listed in _commands(build_parser()):
        name = " ".join(path)
        if not (parser.description or "").strip():
            missing.append(f"{name}: no description")
        if not listed:
            missing.append(f"{name}: no line in its parent's command list")
        for action in _arguments(parser):
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "; ".join(missing)


def test_every_default_is_stated():
    formatter = HelpFormatter("scalelab")
    unstated = []
    for path, parser, _ in _commands(build_parser()):
        for action in _arguments(parser):
            unset = action.default in (None, False, "", [], argparse.SUPPRESS)
            if action.option_strings and not unset and "default" not in formatter._get_help_string(action):
                unstated.append(f"{' '.join(path)} {action.option_strings[0]}")
    assert not unstated, "defaults not stated: " + ", ".join(unstated)
    text = next(p for path, p, _ in _commands(build_parser()) if path[-1] == "plan-run").format_help()
    assert "number of GPUs (default 1)" in text and "DIR/plans/plan-C<budget>/" in " ".join(text.split())


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    r = _fresh_python(probe)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_building_the_parser_loads_no_heavy_package():
    """`scalelab --help` and every command's parsing: no torch (about 1 s), polars, scipy, matplotlib."""
    assert _loaded_after("from scalelab.cli.main import build_parser\nbuild_parser()") == []


def test_bad_input_to_the_saved_fit_commands_exits_before_torch_loads(tmp_path):
    missing, bad = tmp_path / "missing.json", tmp_path / "bad.json"
    bad.write_text('{"law": "chinchilla", "approach": 3}')  # no params: refused by the saved-fit loader
    code = (
        "from scalelab.cli.main import main\n"
        f"codes = [main(['predict', {str(missing)!r}, '--params', '1e9', '--tokens', '2e10']),\n"
        f"         main(['allocate', {str(missing)!r}, '--flops', '1e21']),\n"
        f"         main(['plan-run', {str(missing)!r}, '--flops', '-1']),\n"
        f"         main(['predict', {str(bad)!r}, '--params', '1e9', '--tokens', '2e10']),\n"
        f"         main(['allocate', {str(bad)!r}, '--flops', '1e21']),\n"
        f"         main(['plan-run', {str(bad)!r}, '--flops', '1e21'])]\n"
        "assert codes == [2] * 6, codes"
    )
    assert "torch" not in _loaded_after(code)


def test_sweep_study_on_a_sweep_that_is_not_a_study_names_the_studies_guide(tmp_path, capsys):
    (tmp_path / "sweep.yaml").write_text("name: plain\n")
    assert main(["sweep", "study", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a study" in err[0] and "docs/studies.md" in err[0]
