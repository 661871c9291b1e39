"""Code-shape figures of the repository: lines, imports inside functions, import circles, long files and
functions, how many fit entries, evaluation paths, saved-fit readers and rounds loops the code has, and
who owns the store's paths and the fit's options.

    python scripts/code_metrics.py [ROOT]        # ROOT defaults to the repository this script sits in

Reads the sources with the standard library's `ast` only (nothing is imported or executed), so it
measures any checkout, e.g. `git worktree add /tmp/main main && python scripts/code_metrics.py /tmp/main`.

What it counts (package folders only: the folders `pyproject.toml` maps into `scalelab.<folder>`;
tests/, experiments/, bench/ and scripts/ are listed in the line counts but not in the import figures):
  - lines: physical lines of the .py files under each folder;
  - imports between our own modules (`scalelab.*`, relative imports resolved), and how many of them
    sit inside a function body (an import inside a function hides a dependency from the reader);
    outside cli/ (where imports inside functions keep the CLI's start-up short) each one is listed
    with file:line, the module it imports and the comment on its line or the line above (its reason);
    imports of other packages inside functions (optional dependencies, heavy modules) are counted
    and listed the same way;
  - import circles: strongly connected components of the module graph, every import counted
    (module level, inside functions, under `if TYPE_CHECKING`), because a circle hidden behind an
    import inside a function is still a circle; and the same at folder level (train <-> parallel);
  - files over 500 lines (core files stay readable end to end);
  - functions over 80 and over 100 lines (from the `def` line to the function's last line, its
    decorators not counted; a nested function counts inside its parent and on its own), each with
    the reason its docstring gives for its length ("One piece: ..." or "Over 80 lines ...");
  - fit entries (the functions that take runs and return a fitted law with its intervals),
    evaluation paths (the functions that score a model on the validation sources and the tasks) and
    rounds loops (the loops that launch runs, fit and propose the next round). The first two are
    recognised by a short list of the names known to have played the role (ROLES in
    scripts/code_roles.py: listed, checked to exist, their callers shown, a wrapper of another
    listed one not counted), rounds loops by their shape; scripts/code_roles.py says how. Saved-fit
    readers (the functions that read a saved fit's JSON back) are a third listed role, also found by
    their shape (a function that parses JSON and reads a round file's "fit" or a fit's "law" and
    "params");
  - who owns what (scripts/code_owners.py): store paths built outside store/ (each listed), the fit
    options types, the comparison implementations (and the modules writing a verdict), experiment and
    bench files with `sys.path` tricks or private-name imports, the package modules only experiments,
    benches and tests use, and the experiments without a smoke test.

The reading of sources (folders, module names, imports) is scripts/code_tree.py.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

from code_owners import SCRIPT_FOLDERS, print_owners
from code_roles import ROLES, function_index, long_functions, role_report, rounds_loops, where
from code_tree import (
    OTHER_FOLDERS,
    comment_reason,
    folder_of,
    import_records,
    package_files,
    package_folders,
    short,
)

LONG_FILE_LINES = 500
LONG_FUNCTION_LINES = (80, 100)
CLI_FOLDER = "cli"  # imports inside functions keep the CLI's start-up short: not counted against the code


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


def print_lines(root: Path, folders: tuple[str, ...]) -> None:
    print("\nlines per folder (.py files)")
    total = 0
    for folder in folders + OTHER_FOLDERS:
        paths = list((root / folder).rglob("*.py"))
        n = sum(len(p.read_text().splitlines()) for p in paths)
        total += n
        print(f"  {folder + '/':<13}{len(paths):>4} files {n:>7} lines")
    print(f"  {'total':<13}{'':>10} {total:>7} lines")


def print_imports(root: Path, folders: tuple[str, ...]) -> dict[str, set[str]]:
    """The import figures; returns the module graph (every import of ours counted)."""
    files = package_files(root, folders)
    modules = set(files)
    graph: dict[str, set[str]] = defaultdict(set)
    n_imports = n_inside = outside_cli = 0
    inside_by_folder: dict[str, int] = defaultdict(int)
    listed: dict[bool, list[str]] = {True: [], False: []}  # inside functions outside cli/: ours, others'
    for mod, path in files.items():
        text = path.read_text().splitlines()
        in_cli = folder_of(mod, folders) == CLI_FOLDER
        for r in import_records(mod, path, modules):
            if r.ours:
                graph[mod].add(r.target)
                n_imports += 1
                outside_cli += not in_cli
                n_inside += r.inside
                inside_by_folder[folder_of(mod, folders)] += r.inside
            if r.inside and not in_cli:
                at = f"{path.relative_to(root)}:{r.line}"
                listed[r.ours].append(f"  {at:<40} {short(r.target):<36} {comment_reason(text, r.line)}")
    print(f"\nimports between our own modules: {n_imports}; inside functions: {n_inside}")
    for folder, n in sorted(inside_by_folder.items()):
        if n:
            print(f"  {folder + '/':<11}{n:>4} inside functions")
    n = len(listed[True])
    share = 100.0 * n / outside_cli if outside_cli else 0.0
    print(f"\nimports of our modules inside functions outside {CLI_FOLDER}/: {n} of {outside_cli} ({share:.1f}%)")
    print("  (file:line, the module imported, the comment on its line or the line above: its reason)")
    print("\n".join(listed[True]) or "  none")
    print(f"\nimports of other packages inside functions outside {CLI_FOLDER}/: {len(listed[False])}")
    print("\n".join(listed[False]) or "  none")
    return graph


def print_circles(graph: dict[str, set[str]], folders: tuple[str, ...]) -> None:
    circles = strongly_connected(graph)
    print(f"\nimport circles between modules (every import counted): {len(circles)}")
    for comp in circles:
        print("  " + " <-> ".join(short(m) for m in comp))
    folder_graph: dict[str, set[str]] = defaultdict(set)
    for mod, targets in graph.items():
        for t in targets:
            if folder_of(mod, folders) != folder_of(t, folders):
                folder_graph[folder_of(mod, folders)].add(folder_of(t, folders))
    folder_circles = strongly_connected(folder_graph)
    print(f"import circles between folders: {len(folder_circles)}")
    for comp in folder_circles:
        print("  " + " <-> ".join(comp))


def print_long_files(root: Path, folders: tuple[str, ...]) -> None:
    print(f"\nfiles over {LONG_FILE_LINES} lines")
    long_files = []
    for folder in folders + OTHER_FOLDERS:
        for path in (root / folder).rglob("*.py"):
            n = len(path.read_text().splitlines())
            if n > LONG_FILE_LINES:
                long_files.append((n, path.relative_to(root)))
    for n, rel in sorted(long_files, reverse=True):
        print(f"  {n:>5}  {rel}")
    if not long_files:
        print("  none")


def length_reason(node: ast.AST) -> str | None:
    """The reason a long function gives at its top: the part of its docstring from "One piece" or
    "Over 80 lines" to the end of that paragraph (shortened), or None."""
    doc = ast.get_docstring(node) or ""
    for para in doc.split("\n\n"):
        text = " ".join(para.split())
        for mark in ("One piece", "Over 80 lines"):
            if mark in text:
                reason = text[text.index(mark) :]
                return reason if len(reason) <= 100 else reason[:97] + "..."
    return None


def print_functions(root: Path, folders: tuple[str, ...]) -> None:
    """Long functions of the package folders; fit entries, evaluation paths, rounds loops."""
    index = function_index(root, folders, folders + OTHER_FOLDERS)
    lo, hi = LONG_FUNCTION_LINES
    long = [f for f in long_functions(index, lo) if f.path.relative_to(root).parts[0] in folders]
    reasons = {f.name: length_reason(f.node) for f in long}
    unexplained = sum(r is None for r in reasons.values())
    print(f"\nfunctions over {hi} lines: {sum(f.lines > hi for f in long)}; over {lo} lines: {len(long)}, "
          f"{unexplained} without a reason at its top")  # fmt: skip
    for f in long:
        print(f"  {f.lines:>5}  {f.name:<52} {where(root, f)}")
        print(f"         reason: {reasons[f.name] or 'none'}")

    for role in ROLES:
        lines, entries = role_report(root, index, role)
        print(f"\n{role.name}: functions that {role.what}")
        print("\n".join(lines))
        print(f"  {role.name}: {entries}")
    loops = rounds_loops(index)
    print("\nrounds loops: functions with a for/while loop that proposes a round (calls *propose*) and")
    print("launches runs (calls *launch*, *execute* or *resume*)")
    for f in loops:
        print(f"  {f.name:<52} {where(root, f)}")
    outside = sum(f.name.split(".")[0] in SCRIPT_FOLDERS for f in loops)
    print(f"  rounds loops: {len(loops) - outside} in the package folders, {outside} in experiments/ and bench/")


def main(root: Path) -> None:
    folders = package_folders(root)
    print(f"code metrics of {root}")
    print_lines(root, folders)
    graph = print_imports(root, folders)
    print_circles(graph, folders)
    print_long_files(root, folders)
    print_functions(root, folders)
    print_owners(root, folders)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
