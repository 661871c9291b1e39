"""The package list in pyproject.toml covers every root folder with an __init__.py."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and rel.parts[0] in {"tests", "bench", "build", "docs"} or "egg-info" in str(rel):
            continue
        if any(p.startswith(".") for p in rel.parts):
            continue
        found.add(str(rel))
    dirs_listed = {mapping[p] for p in listed}
    missing = sorted(found - dirs_listed)
    assert not missing, f"folders with __init__.py missing from pyproject packages: {missing}"
    assert all(mapping[p] and (ROOT / mapping[p] / "__init__.py").exists() for p in listed)


def test_subpackages_import_under_scalelab():
    import importlib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for pkg in cfg["packages"]:
        mod = importlib.import_module(pkg)
        assert mod.__doc__, f"{pkg} has no module docstring"


def test_the_store_sits_at_the_bottom():
    """scalelab.store imports only itself, scalelab.errors and scalelab.config_tree (never train/, sweeps/, ...)."""
    import ast

    allowed = ("scalelab.store", "scalelab.errors", "scalelab.config_tree")
    bad = []
    for path in sorted((ROOT / "store").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.module != "scalelab" else [f"scalelab.{a.name}" for a in node.names]
            for name in names:
                if name.startswith("scalelab") and not name.startswith(allowed):
                    bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, bad
