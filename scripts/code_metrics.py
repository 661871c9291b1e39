"""Code-shape figures of the repository: lines per folder, imports inside functions, import circles, long files.

    python scripts/code_metrics.py [ROOT]        # ROOT defaults to the repository this script sits in

Reads the sources with the standard library's `ast` only (nothing is imported or executed), so it
measures any checkout, e.g. `git worktree add /tmp/main main && python scripts/code_metrics.py /tmp/main`.

What it counts (package folders only: the folders `pyproject.toml` maps into `scalelab.<folder>`;
tests/, bench/ and scripts/ are listed in the line counts but not in the import figures):
  - lines: physical lines of the .py files under each folder;
  - imports between our own modules (`scalelab.*`, relative imports resolved), and how many of them
    sit inside a function body (an import inside a function hides a dependency from the reader);
  - import circles: strongly connected components of the module graph, every import counted
    (module level, inside functions, under `if TYPE_CHECKING`), because a circle hidden behind an
    import inside a function is still a circle; and the same at folder level (train ↔ parallel);
  - files over 500 lines (STYLE.md: core files stay readable end to end, 300–600 lines).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE_FOLDERS = (
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
OTHER_FOLDERS = ("tests", "bench", "scripts")
LONG_FILE_LINES = 500


def module_name(root: Path, path: Path) -> str:
    """scalelab.<folder>.<...> for a file under a package folder (the setuptools package-dir mapping)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] != "scalelab":
        parts.insert(0, "scalelab")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(root: Path) -> dict[str, Path]:
    files = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            files[module_name(root, path)] = path
    return files


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest module of ours that `name` (a dotted import target) names or lies inside."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(mod: str, path: Path, modules: set[str]) -> list[tuple[str, bool]]:
    """(imported module of ours, inside a function?) for every import statement in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                # `from scalelab.train import checkpoint` imports the module scalelab.train.checkpoint
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in child.names
                ]
            for target in dict.fromkeys(targets):
                hit = _resolve(target, modules)
                if hit is not None and hit != mod:
                    found.append((hit, in_function))
            visit(child, inside)

    visit(tree, False)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's SCCs with more than one member (the import circles), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def folder_of(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGE_FOLDERS else "scalelab"


def main(root: Path) -> None:
    print(f"code metrics of {root}")
    print("\nlines per folder (.py files)")
    total = 0
    for folder in PACKAGE_FOLDERS + OTHER_FOLDERS:
        paths = list((root / folder).rglob("*.py"))
        n = sum(len(p.read_text().splitlines()) for p in paths)
        total += n
        print(f"  {folder + '/':<11}{len(paths):>4} files {n:>7} lines")
    print(f"  {'total':<11}{'':>10} {total:>7} lines")

    files = package_files(root)
    modules = set(files)
    graph: dict[str, set[str]] = defaultdict(set)
    n_imports = n_inside = 0
    inside_by_folder: dict[str, int] = defaultdict(int)
    for mod, path in files.items():
        for target, inside in imports_of(mod, path, modules):
            graph[mod].add(target)
            n_imports += 1
            if inside:
                n_inside += 1
                inside_by_folder[folder_of(mod)] += 1
    print(f"\nimports between our own modules: {n_imports}; inside functions: {n_inside}")
    for folder, n in sorted(inside_by_folder.items()):
        print(f"  {folder + '/':<11}{n:>4} inside functions")

    circles = strongly_connected(graph)
    print(f"\nimport circles between modules (every import counted): {len(circles)}")
    for comp in circles:
        print("  " + " <-> ".join(m.removeprefix("scalelab.") for m in comp))
    folder_graph: dict[str, set[str]] = defaultdict(set)
    for mod, targets in graph.items():
        for t in targets:
            if folder_of(mod) != folder_of(t):
                folder_graph[folder_of(mod)].add(folder_of(t))
    folder_circles = strongly_connected(folder_graph)
    print(f"import circles between folders: {len(folder_circles)}")
    for comp in folder_circles:
        print("  " + " <-> ".join(comp))

    print(f"\nfiles over {LONG_FILE_LINES} lines")
    long_files = []
    for folder in PACKAGE_FOLDERS + OTHER_FOLDERS:
        for path in (root / folder).rglob("*.py"):
            n = len(path.read_text().splitlines())
            if n > LONG_FILE_LINES:
                long_files.append((n, path.relative_to(root)))
    for n, rel in sorted(long_files, reverse=True):
        print(f"  {n:>5}  {rel}")
    if not long_files:
        print("  none")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
