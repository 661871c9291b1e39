"""Figures of who owns what, for `scripts/code_metrics.py`: store paths built outside store/, the fit
options types, the comparison implementations, the experiments' and benches' shortcuts, the
package modules only they and tests use, the experiments without a smoke test, and the experiments
whose `__main__` block handles errors on its own.

    print_owners(root, folders)       # after code_metrics' other figures

Standard library `ast` only, like the rest of scripts/code_metrics.py. What each figure counts:
  - store paths built outside store/: a string literal naming a sweep store's file or folder
    (STORE_NAMES, or a `round_...` / `fits/...` pattern) used to build a path: an operand of `/`, or an
    argument of join, joinpath, glob or rglob; in the package folders other than store/, and in
    experiments/ and bench/. store/paths.py's SweepLayout names every such path, so each hit is listed (file:line);
  - fit options types: the classes in the package folders that declare which law to fit (a `law`
    field) with the knobs of how a run table is fitted (FIT_KNOBS: bootstrap, starts, candidates,
    noise_floor), whatever they are named: a spec's `fit:` section kept as a class of its own
    counts; a fit's result (a `law`, its parameters, its target) does not, nor a per-run curve-law
    config (early stopping's, W&B live prediction's: `law`, `n_boot`), another fit's options. The
    CLI's arguments are a shape that is not a class;
  - comparison implementations: package modules that answer "is B better than A" themselves: they
    define a comparison result (a class with a `multiplier_at_target` field) or compute the compute
    multiplier's interval over paired draws (a call of `paired_multipliers`, or one function that
    calls both `multiplier` and `interval`: the same computed by hand); fitting/comparisons/multiplier.py, the
    arithmetic they share, is not one. The modules that write a verdict (a function named
    `*verdict*`) are counted beside them;
  - experiment and bench files that reach into each other or the package's privates: a `sys.path.insert` /
    `sys.path.append` call, or an import of a name starting with `_`;
  - bench-only modules: package modules that no product code reaches through its imports (from
    cli/'s modules, each package's `__init__.py`, the modules started by name, e.g.
    `-m scalelab.sweeps.execution.ray_reaper`, and those docs/ or README.md name as `scalelab.x.y`, the
    documented API) but that experiments/, bench/ or tests/ import (or another bench-only module does);
  - experiments with a smoke test: the modules of experiments/ whose `main` a test module uses
    (`NAME.main(...)`, or `NAME.main` handed to a helper, after `from experiments import NAME` or
    `import experiments.NAME as NAME`; or `main` after `from experiments.NAME import main`); a module
    without a `main` (functions other experiments use) counts when a test module imports it;
  - experiments whose `__main__` block is anything but `run_script(main, __file__)`
    (scalelab.errors.run_script: bad input is one line naming the key and the fix, exit 2).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from code_tree import import_records, module_name, package_files, resolve, short

STORE_FOLDER = "store"
STORE_NAMES = ("sweep.yaml", "sweep.resolved.json", "ledger.json", "events.jsonl", "runs", "fits", "rounds", "plans")
STORE_PATTERN = re.compile(r"(round_.*|(fits|rounds|plans|runs)/.*)")
PATH_CALLS = ("join", "joinpath", "glob", "rglob")
STARTED = re.compile(r'"-m",\s*"(scalelab(?:\.\w+)+)"|-m (scalelab(?:\.\w+)+)')  # python -m scalelab.x
CLI_PACKAGE = "scalelab.cli."  # the commands: the product's surface
FIT_KNOBS = ("bootstrap", "starts", "candidates", "noise_floor")
SCRIPT_FOLDERS = ("experiments", "bench")  # code on the package's public API, outside the package


def _literal(node: ast.AST) -> str | None:
    """A string constant's text; an f-string's constant parts with `{}` for each value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _store_name(node: ast.AST) -> str | None:
    text = _literal(node)
    if text is not None and (text in STORE_NAMES or STORE_PATTERN.fullmatch(text)):
        return text
    return None


def store_path_sites(path: Path) -> list[tuple[int, str]]:
    """(line, literal) for each store name used to build a path in `path` (module docstring)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        operands: list[ast.AST] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            operands = list(node.args) if name in PATH_CALLS else []
        found += [(o.lineno, text) for o in operands if (text := _store_name(o)) is not None]
    return sorted(set(found))


def print_store_paths(root: Path, folders: tuple[str, ...]) -> None:
    sites = []
    for folder in [f for f in folders if f != STORE_FOLDER] + list(SCRIPT_FOLDERS):
        for path in sorted((root / folder).rglob("*.py")):
            sites += [(path.relative_to(root), line, text) for line, text in store_path_sites(path)]
    outside = sum(rel.parts[0] in SCRIPT_FOLDERS for rel, _, _ in sites)
    print(f"\nstore paths built outside {STORE_FOLDER}/ (a store file's name joined by hand; store/paths.py "
          f"SweepLayout names them): {len(sites) - outside} in the package folders, {outside} in experiments/ "
          "and bench/")  # fmt: skip
    for rel, line, text in sites:
        print(f"  {f'{rel}:{line}':<40} {text!r}")


def _class_fields(node: ast.ClassDef) -> set[str]:
    """The names a class body assigns (a dataclass's fields, plain class attributes)."""
    out = set()
    for b in node.body:
        if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
            out.add(b.target.id)
        elif isinstance(b, ast.Assign):
            out |= {t.id for t in b.targets if isinstance(t, ast.Name)}
    return out


def fit_options_types(root: Path, folders: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(module.Class, file) for each fit options type (module docstring)."""
    found = []
    for mod, path in package_files(root, folders).items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                fields = _class_fields(node)
                if "law" in fields and fields & set(FIT_KNOBS):
                    found.append((f"{short(mod)}.{node.name}", path))
    return sorted(found)


def print_fit_options(root: Path, folders: tuple[str, ...]) -> None:
    found = fit_options_types(root, folders)
    print(f"\nfit options types: {len(found)} (and the CLI's arguments)")
    print("\n".join(f"  {dotted:<52} {path.relative_to(root)}" for dotted, path in found) or "  none")


def _called(node: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def comparison_sites(path: Path) -> tuple[list[str], bool]:
    """(what makes `path` a comparison implementation, each with its line; whether it writes a verdict)."""
    found, verdict = [], False
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ClassDef) and "multiplier_at_target" in _class_fields(node):
            found.append(f"result class {node.name} (line {node.lineno})")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            verdict |= "verdict" in node.name
            calls = {c for c in _called(node) if c in ("paired_multipliers", "multiplier", "interval")}
            if "paired_multipliers" in calls or {"multiplier", "interval"} <= calls:
                found.append(f"m's paired interval in {node.name} (line {node.lineno})")
    return found, verdict


def print_comparisons(root: Path, folders: tuple[str, ...]) -> None:
    rows, writers = [], []
    for mod, path in package_files(root, folders).items():
        found, verdict = comparison_sites(path)
        if mod.endswith(".fitting.comparisons.multiplier"):
            continue  # the multiplier's arithmetic itself
        if found:
            rows.append((path.relative_to(root), found))
        if verdict:
            writers.append(str(path.relative_to(root)))
    print(f"\ncomparison implementations (is B better than A, built in the module): {len(rows)}; "
          f"modules writing a verdict: {len(writers)} ({', '.join(sorted(writers)) or 'none'})")  # fmt: skip
    for rel, found in sorted(rows):
        print(f"  {str(rel):<40} {'; '.join(found)}")


def bench_shortcuts(path: Path) -> list[str]:
    """What a bench file does that an experiment on the public API would not (module docstring)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr in ("insert", "append"):
            owner = func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "path" and getattr(owner.value, "id", "") == "sys":
                out.append(f"sys.path.{func.attr} (line {node.lineno})")
        if isinstance(node, ast.ImportFrom):
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private:
                out.append(f"from {node.module} import {', '.join(private)} (line {node.lineno})")
    return out


def print_bench_shortcuts(root: Path) -> None:
    paths = [p for folder in SCRIPT_FOLDERS for p in sorted((root / folder).rglob("*.py"))]
    rows = [(p.relative_to(root), bench_shortcuts(p)) for p in paths]
    rows = [(rel, found) for rel, found in rows if found]
    print(f"\nexperiment and bench files with sys.path tricks or private-name imports: {len(rows)}")
    for rel, found in rows:
        print(f"  {str(rel):<40} {'; '.join(found)}")


def bench_only_modules(root: Path, folders: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """(module, the experiments/bench/tests modules importing it) for each bench-only module (module docstring)."""
    files = package_files(root, folders)
    modules = set(files)
    graph = {mod: {r.target for r in import_records(mod, path, modules) if r.ours} for mod, path in files.items()}
    named = set()  # started by name (`-m scalelab.x`), or documented as the public API
    for path in files.values():
        named |= {a or b for a, b in STARTED.findall(path.read_text())}
    for path in [*sorted((root / "docs").glob("*.md")), root / "README.md"]:
        named |= set(re.findall(r"scalelab(?:\.\w+)+", path.read_text() if path.is_file() else ""))
    roots = {m for m, p in files.items() if p.name == "__init__.py" or m.startswith(CLI_PACKAGE)}
    roots |= {m for m in (resolve(n, modules) for n in named) if m}  # scalelab.x.y.Name: its module
    seen, todo = set(roots), list(roots)
    while todo:
        for t in graph.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    users: dict[str, list[str]] = defaultdict(list)  # experiments/bench/tests modules, or a bench-only module
    for folder in (*SCRIPT_FOLDERS, "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            mod = module_name(root, path, folders)
            for r in import_records(mod, path, modules):
                if r.ours and r.target not in seen and mod not in users[r.target]:
                    users[r.target].append(mod)
    todo = list(users)
    while todo:  # what a bench-only module imports and the product does not is bench-only too
        mod = todo.pop()
        for t in graph[mod] - seen:
            if not users[t]:
                todo.append(t)
            if mod not in users[t]:
                users[t].append(mod)
    return sorted((m, users[m]) for m in modules - seen if users[m])


def print_bench_only(root: Path, folders: tuple[str, ...]) -> None:
    found = bench_only_modules(root, folders)
    print(f"\nbench-only modules in the package (no product code imports them; experiments/, bench/ or tests/ do): "
          f"{len(found)}")  # fmt: skip
    for mod, users in found:
        by = [u for u in users if u.startswith("scalelab.")]
        scripts = [u for u in users if u.split(".")[0] in SCRIPT_FOLDERS]
        via = f", and {', '.join(short(u) for u in by)}" if by else ""
        tests = len(users) - len(scripts) - len(by)
        print(f"  {short(mod):<40} {len(scripts)} experiment/bench file(s), {tests} test file(s){via}")


def _has_main(path: Path) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(path.read_text()).body)


def _mains_called(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(experiments.NAME a test module imports, experiments.NAME whose `main` it uses: calls, or
    hands to a helper that calls it)."""
    imported, alias, called = set(), {}, set()  # alias: a local name -> experiments.NAME, or its main
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                imported.add(a.name)
                if a.asname:
                    alias[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):  # `NAME.main` or an imported `main`, called or handed to a helper
        if isinstance(node, ast.Attribute) and node.attr == "main" and isinstance(node.value, ast.Name):
            called.add(alias.get(node.value.id, ""))
        elif isinstance(node, ast.Name) and alias.get(node.id, "").endswith(".main"):
            called.add(alias[node.id].removesuffix(".main"))
    return imported, called


def smoke_tested(root: Path) -> dict[str, list[str]]:
    """experiments.NAME -> the test modules that smoke-test it: call its `main` (a module with one),
    or import it (a module of functions other experiments use), for every module of experiments/."""
    paths = {f"experiments.{p.stem}": p for p in sorted((root / "experiments").glob("*.py")) if p.stem != "__init__"}
    with_main = {mod for mod, p in paths.items() if _has_main(p)}
    found: dict[str, list[str]] = {mod: [] for mod in paths}
    for path in sorted((root / "tests").rglob("*.py")):
        imported, called = _mains_called(ast.parse(path.read_text(), filename=str(path)))
        for mod in found:
            if mod in (called if mod in with_main else imported):
                found[mod].append(path.stem)
    return found


def print_smoke_tests(root: Path) -> None:
    found = smoke_tested(root)
    missing = [m for m, tests in found.items() if not tests]
    print(
        f"\nexperiments with a smoke test (a test calls its main, or imports a module without one): "
        f"{len(found) - len(missing)} of {len(found)}"
    )
    for mod in missing:
        print(f"  {mod:<40} no test calls its main")


def unguarded_mains(root: Path) -> tuple[int, list[str]]:
    """(experiments with a `__main__` block, those whose block is not `run_script(main, __file__)`:
    scalelab.errors.run_script, the one place that turns bad input into one line and exit 2)."""
    blocks, bare = 0, []
    for path in sorted((root / "experiments").glob("*.py")):
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            test = node.test if isinstance(node, ast.If) else None
            if not (isinstance(test, ast.Compare) and getattr(test.left, "id", "") == "__name__"):
                continue
            blocks += 1
            first = node.body[0]
            call = first.value if isinstance(first, ast.Expr) else None
            if len(node.body) != 1 or not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "run_script"):
                bare.append(f"experiments/{path.name}:{node.lineno}")
    return blocks, bare


def print_unguarded_mains(root: Path) -> None:
    blocks, bare = unguarded_mains(root)
    print(
        f"\nexperiments whose __main__ handles errors on its own (not run_script(main, __file__)): "
        f"{len(bare)} of {blocks}"
    )
    for where in bare:
        print(f"  {where}")


def print_owners(root: Path, folders: tuple[str, ...]) -> None:
    print_store_paths(root, folders)
    print_fit_options(root, folders)
    print_comparisons(root, folders)
    print_bench_shortcuts(root)
    print_bench_only(root, folders)
    print_smoke_tests(root)
    print_unguarded_mains(root)
