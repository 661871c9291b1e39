"""The repository's Python sources as `scripts/code_metrics.py` reads them: folders, module names, imports.

    folders = package_folders(root)                 # from pyproject.toml's package-dir
    files = package_files(root, folders)            # {"scalelab.train.loop": Path(...)}
    for r in import_records("scalelab.train.loop", path, set(files)): ...

Standard library `ast` only: nothing is imported or executed, so any checkout can be measured.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

# The folders pyproject.toml maps into scalelab.<folder>, for a checkout whose pyproject does not say.
DEFAULT_PACKAGE_FOLDERS = (
    "scalelab",
    "store",
    "models",
    "parallel",
    "kernels",
    "train",
    "sweeps",
    "fitting",
    "analysis",
    "cli",
)
OTHER_FOLDERS = ("tests", "experiments", "bench", "scripts")


def package_folders(root: Path) -> tuple[str, ...]:
    """The root folders pyproject.toml's package-dir maps into scalelab."""
    try:
        mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return DEFAULT_PACKAGE_FOLDERS
    return tuple(dict.fromkeys(d.split("/")[0] for k, d in mapping.items() if d and k.split(".")[0] == "scalelab"))


def module_name(root: Path, path: Path, folders: tuple[str, ...]) -> str:
    """scalelab.<folder>.<...> for a file under a package folder (the setuptools package-dir mapping);
    <folder>.<...> for one under tests/, bench/ or scripts/."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] not in folders:
        return ".".join(parts)
    if parts[0] != "scalelab":
        parts.insert(0, "scalelab")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(root: Path, folders: tuple[str, ...]) -> dict[str, Path]:
    files = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            files[module_name(root, path, folders)] = path
    return files


def folder_of(mod: str, folders: tuple[str, ...]) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in folders else "scalelab"


def short(name: str) -> str:
    return name.removeprefix("scalelab.")


def resolve(name: str, modules: set[str]) -> str | None:
    """The longest module of ours that `name` (a dotted import target) names or lies inside."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def absolute_from(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` statement of module `mod` imports from."""
    base = node.module or ""
    if node.level:
        pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return base


@dataclass(frozen=True)
class ImportRecord:
    target: str  # our module (scalelab.x.y) or, for another package, the name imported (ray.tune)
    ours: bool
    inside: bool  # inside a function body
    line: int


def import_records(mod: str, path: Path, modules: set[str]) -> list[ImportRecord]:
    """Every import statement's targets in `path`: ours resolved to modules, others as written."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: list[ImportRecord] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = absolute_from(mod, is_pkg, child)
                # `from scalelab.train import checkpoint` imports the module scalelab.train.checkpoint
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in child.names
                ]
            for target in dict.fromkeys(targets):
                hit = resolve(target, modules)
                if hit is not None and hit != mod:
                    found.append(ImportRecord(hit, True, in_function, child.lineno))
                elif hit is None and not target.startswith("scalelab") and target != "__future__":
                    found.append(ImportRecord(target, False, in_function, child.lineno))
            visit(child, inside)

    visit(tree, False)
    return found


def comment_reason(lines: list[str], line: int) -> str:
    """The comment on a statement's line, or on the comment line just above it ('' when none)."""
    here = lines[line - 1]
    if "#" in here:
        return here.split("#", 1)[1].strip()
    above = lines[line - 2].strip() if line >= 2 else ""
    return above[1:].strip() if above.startswith("#") else ""
