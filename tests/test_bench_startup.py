"""bench/startup_and_plan_run.py's --before side: a revision's folders assembled into an import root
from pyproject's package-dir (every entry: scalelab's floors, their sub-packages and the top-level
`experiments`), which a fresh interpreter imports instead of the installed package."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("startup_and_plan_run", ROOT / "bench" / "startup_and_plan_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_revisions_tree_imports_the_package_and_the_experiments_from_that_revision(tmp_path):
    (tmp_path / "rev").mkdir()
    tree = _bench().revision_tree("HEAD", tmp_path / "rev")
    code = (
        "import scalelab.sweeps.specs as s, scalelab.train.data as d, experiments;"
        "print(s.__file__, d.__file__, experiments.__file__, sep='\\n')"
    )
    env = dict(os.environ, PYTHONPATH=str(tree))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    files = res.stdout.split()
    assert len(files) == 3 and all(f.startswith(str(tree)) for f in files), files
