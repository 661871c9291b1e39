"""scripts/code_metrics.py on a small made-up checkout: every figure it prints is the one built in."""

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import code_metrics  # noqa: E402

PYPROJECT = """
[tool.setuptools.package-dir]
"scalelab" = "scalelab"
"scalelab.fitting" = "fitting"
"scalelab.sweeps" = "sweeps"
"scalelab.cli" = "cli"
"scalelab.store" = "store"
"""
LONG_BODY = "\n".join(f"    x{i} = {i}" for i in range(101))
FILES = {
    "scalelab/__init__.py": '"""root"""\n',
    "fitting/__init__.py": '"""fitting"""\n',
    # the one fit entry, and a long function
    "fitting/entry/fit_runs.py": "import numpy as np\n\n\ndef fit_runs(table):\n    return np.mean(table)\n\n\n"
    + "def long_one():\n"
    + LONG_BODY
    + '\n\n\ndef long_two():\n    """Two.\n\n    One piece: a made-up\n    table."""\n'
    + LONG_BODY,
    "sweeps/__init__.py": '"""sweeps"""\n',
    # a wrapper of the fit entry (not a second entry), two imports inside functions, a module cycle
    "sweeps/closed_loop/store_fit.py": """
        from scalelab.fitting.entry import fit_runs as fr
        from scalelab.sweeps.closed_loop import rounds

        def fit_store(path):
            from scalelab.fitting.entry.fit_runs import fit_runs  # the reason
            import json
            return fit_runs(json.loads(path)), fr.fit_runs
        """,
    "sweeps/closed_loop/rounds.py": """
        from scalelab.sweeps.closed_loop.store_fit import fit_store

        def propose_round(d):
            return fit_store(d)

        def launch(p):
            return p

        def run_rounds(d, n):
            for _ in range(n):
                launch(propose_round(d))
        """,
    "cli/__init__.py": '"""cli"""\n',
    "cli/main.py": """
        def main():
            from scalelab.sweeps.closed_loop.rounds import run_rounds  # CLI start-up: not counted
            return run_rounds(".", 2)
        """,
    # a second fit stack in the benches' clothing: a rounds loop of its own, a sys.path trick, a
    # private name of another bench, and the one user of a package module
    "bench/loop.py": """
        import sys

        from scalelab.fitting.selection import simulate
        from scalelab.sweeps.closed_loop.rounds import launch, propose_round

        sys.path.insert(0, ".")
        from other_bench import _private  # noqa: E402

        while True:
            launch(propose_round(simulate.__name__))
        """,
    "fitting/selection/simulate.py": '"""only the bench uses it"""\n',
    # an experiment that imports another's private name and one of the package's only-for-tests
    # modules, its __main__ handling errors its own way; a second experiment, smoke-tested (a test
    # calls its main), a third that a test imports without calling its main (no smoke test), and a
    # module of functions without a main that a test imports (tested)
    "experiments/__init__.py": '"""experiments"""\n',
    "experiments/probe.py": "from experiments.tested import _helper\nfrom scalelab.store import probe_only\n\n\n"
    + "def main():\n    return 0\n\n\nif __name__ == '__main__':\n    main()\n",
    "experiments/tested.py": "def _helper():\n    return 1\n\n\ndef main(argv=None):\n    return 0\n\n\n"
    + "if __name__ == '__main__':\n    run_script(main, __file__)\n",
    "experiments/imported.py": "def main(argv=None):\n    return 0\n",
    "experiments/shared.py": "def helper():\n    return 0\n",
    "store/probe_only.py": '"""only an experiment and a test use it"""\n',
    "tests/test_tested.py": "from experiments import imported, shared, tested\n"
    + "from scalelab.store import probe_only\n\nassert tested.main([]) == 0\n",
    # the store names its own paths; a sweep module that joins them by hand twice
    "store/__init__.py": '"""store"""\n',
    "store/paths.py": 'def spec(d):\n    return d / "sweep.yaml"\n',
    "sweeps/store_read.py": 'def spec(d):\n    return d / "sweep.yaml", d.glob("fits/round_*.json")\n',
    # the fit's options, a second shape of them under another name, and a fit's result (not options)
    "fitting/entry/fit_options.py": "class FitOptions:\n    law = 'chinchilla'\n    bootstrap = 0\n",
    "sweeps/spec_fit.py": "class FitSection:\n    law: str = 'chinchilla'\n    candidates: list = []\n",
    "fitting/result.py": "class Result:\n    law: str = 'chinchilla'\n    target_flops: float = 0.0\n",
    # "is B better than A" built twice: a result class with its verdict, and a study's interval of m
    # by hand; the multiplier's arithmetic itself is not a comparison
    "fitting/compare_two.py": """
        class Cmp:
            multiplier_at_target: float = 1.0

        def write_verdict(cmp):
            return "B" if cmp.multiplier_at_target > 1 else "A"
        """,
    "sweeps/study_pick.py": "def width(a, b):\n    return interval([multiplier(a, b)], 0.95)\n",
    "fitting/comparisons/multiplier.py": (
        "def paired_multipliers(a, b):\n    return interval([multiplier(a, b)], 0.95)\n"
    ),
    # two saved-fit readers, one a wrapper of the other
    "fitting/entry/from_report.py": """
        def allocate_from_fit(fit):
            return fit["params"]

        def predict_from_fit(fit):
            return allocate_from_fit(fit)
        """,
    # a third, not listed: it parses a round file and takes its fit by hand
    "sweeps/round_read.py": """
        import json

        def latest_fit(path):
            return json.loads(path.read_text())["fit"]
        """,
}


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    for rel, text in FILES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_figures_of_a_made_up_checkout(checkout, capsys):
    code_metrics.main(checkout)
    out = capsys.readouterr().out
    assert "imports of our modules inside functions outside cli/: 1 of 4 (25.0%)" in out, out
    assert "sweeps/closed_loop/store_fit.py:6" in out and "fitting.entry.fit_runs" in out and "the reason" in out
    assert (
        "imports of other packages inside functions outside cli/: 1" in out
        and "sweeps/closed_loop/store_fit.py:7" in out
    )
    assert "import circles between modules (every import counted): 1" in out
    assert "sweeps.closed_loop.rounds <-> sweeps.closed_loop.store_fit" in out
    assert "functions over 100 lines: 2; over 80 lines: 2, 1 without a reason at its top" in out, out
    assert "fitting.entry.fit_runs.long_one" in out and "reason: none" in out
    assert "fitting.entry.fit_runs.long_two" in out and "reason: One piece: a made-up table." in out
    assert "sweeps.closed_loop.store_fit.fit_store" in out and "calls fitting.entry.fit_runs.fit_runs" in out
    assert "called by sweeps.closed_loop.store_fit.fit_store" in out
    assert "fit entries: 1\n" in out and "fitting.pipeline.fit_table" in out and "not in this checkout" in out
    assert "evaluation paths: 0\n" in out
    assert "sweeps.closed_loop.rounds.run_rounds" in out and "bench.loop.<module>" in out
    assert "rounds loops: 1 in the package folders, 1 in experiments/ and bench/" in out
    assert "SweepLayout names them): 2 in the package folders, 0 in experiments/ and bench/" in out, out
    assert "sweeps/store_read.py:2" in out and "'fits/round_*.json'" in out and "store/paths.py:2" not in out
    assert "fit options types: 2 (and the CLI's arguments)" in out and "fitting.entry.fit_options.FitOptions" in out
    assert "sweeps.spec_fit.FitSection" in out and "fitting.result.Result" not in out
    assert "comparison implementations (is B better than A, built in the module): 2; modules writing a " in out
    assert "verdict: 1 (fitting/compare_two.py)" in out and "fitting/comparisons/multiplier.py" not in out
    assert "result class Cmp (line 2)" in out and "m's paired interval in width (line 1)" in out
    assert "experiment and bench files with sys.path tricks or private-name imports: 2" in out
    assert "sys.path.insert (line 7)" in out and "from other_bench import _private" in out
    assert "experiments/probe.py" in out and "from experiments.tested import _helper (line 1)" in out
    assert "(no product code imports them; experiments/, bench/ or tests/ do): 2" in out
    assert "fitting.selection.simulate" in out and "1 experiment/bench file(s), 0 test file(s)" in out
    assert "store.probe_only" in out and "1 experiment/bench file(s), 1 test file(s)" in out
    assert "experiments with a smoke test (a test calls its main, or imports a module without one): 2 of 4" in out
    assert (
        "experiments.probe                        no test calls its main" in out and "experiments.tested  " not in out
    )
    assert "experiments.imported                     no test calls its main" in out and "experiments.shared " not in out
    assert "experiments whose __main__ handles errors on its own (not run_script(main, __file__)): 1 of 2" in out
    assert "experiments/probe.py:9" in out and "experiments/tested.py:" not in out
    assert (
        "fitting.entry.from_report.predict_from_fit" in out
        and "calls fitting.entry.from_report.allocate_from_fit" in out
    )
    assert "sweeps.round_read.latest_fit" in out and "an entry (not listed: found by its shape)" in out
    assert "saved-fit readers: 2\n" in out
