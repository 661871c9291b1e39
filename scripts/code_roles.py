"""Functions of the repository for `scripts/code_metrics.py`: long functions, and the roles some play.

    index = function_index(root, folders, ("models", ..., "tests", "bench"))
    long_functions(index, 80)                     # [Function, ...], longest first
    role_report(root, index, ROLES[0])            # lines of text and the role's figure
    rounds_loops(index)                           # functions with a rounds loop

A function's length runs from its `def` line to its last line (decorators not counted); a nested
function counts inside its parent and on its own.

Roles. Fit entries (take a table of runs, return a fitted law with its intervals), evaluation
paths (score a model on the validation sources and the tasks into evaluation rows) and saved-fit
readers (a saved fit's JSON back into what predicts or plans) are recognised by name: ROLES lists
every function known to have played the role, old names and new. The report says which of them
exist in the checkout, who calls each (functions of the package and bench/, and how many test
files), and counts an existing one only when it does not reach another listed one
through the functions it references, transitively (a wrapper that loads a store and calls the one
fit entry is a caller, not a second entry). A function that plays the role under a name not in the
list is not seen: list it when you add one; saved-fit readers are also found by their shape (a
function that parses JSON and reads the key "fit", a round file's fit, or both "law" and "params"),
listed or not. Rounds loops are recognised by their shape instead: a
`for`/`while` loop whose body calls a function named *propose* and one named *launch*, *execute* or
*resume* (package folders and bench/; tests are not searched).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from code_tree import absolute_from, module_name, short


@dataclass(frozen=True)
class Role:
    """A role some functions of the code play, and the functions known to have played it."""

    name: str
    what: str
    known: tuple[str, ...]  # module.function, without the leading "scalelab."
    shape: tuple[str, ...] = ()  # keys ("a+b": both) whose reading after a JSON parse marks a function


# A function that parses JSON (json.load/json.loads) and reads the key "fit" (a round file's fit) or
# both "law" and "params" (a fit's own keys) reads a saved fit by hand, listed or not.
SAVED_FIT_KEYS = ("fit", "law+params")

ROLES = (
    Role(
        "fit entries",
        "fit a scaling law to a table of runs, for its parameters and intervals (what `scalelab fit`, "
        "`sweep next`, the report, `compare` and the benches call)",
        (
            "fitting.pipeline.fit_table",
            "fitting.loopfit.fit_for_loop",
            "analysis.lawfit.fit_store",
            "analysis.lawfit.fit_point",  # with bootstrap_params: the fit of analyses (compare, downstream)
            "fitting.fit_runs.fit_runs",
            "fitting.entry.fit_runs.fit_runs",
            "sweeps.store_fit.fit_store",
            "sweeps.closed_loop.store_fit.fit_store",
        ),
    ),
    Role(
        "evaluation paths",
        "score a model on the validation sources and the tasks into evaluation rows (what the "
        "training loop, `scalelab eval`, `sweep eval` and `eval-parity` run)",
        (
            "train.loop._evaluate",
            "train.eval_checkpoint.evaluate_checkpoint",
            "train.eval_parallel.evaluate_checkpoint_parallel",
            "train.eval_model.evaluate",
        ),
    ),
    Role(
        "saved-fit readers",
        "read a saved fit (`scalelab fit --out` FIT.json, a round's fits/round_K.json) back into what "
        "predicts or plans (what `predict`, `allocate`, `plan-run`, the report, the generators and benches call)",
        (
            "fitting.saved_fit.load_saved_fit",
            "fitting.entry.saved_fit.load_saved_fit",
            "cli.fit_cmd._load",
            "fitting.from_report.predict_from_fit",
            "fitting.entry.from_report.predict_from_fit",
            "fitting.from_report.allocate_from_fit",
            "fitting.entry.from_report.allocate_from_fit",
            "planning.loss_model.load_loss_model",
            "analysis.lawfit.store_fit_from_record",
            "analysis.report_loop.loop_fit",
            "sweeps.isoflop_grid.read_frontier",
            "sweeps.specs.isoflop_grid.read_frontier",
            "sweeps.proposal.read_round",
            "sweeps.closed_loop.proposal.read_round",
            "experiments.closed_loop.round_fits",
            "sweeps.wandb_fit.round_records",  # the rounds a W&B fit run logs
            "sweeps.tracking.wandb_fit.round_records",  # the rounds a W&B fit run logs
        ),
        shape=SAVED_FIT_KEYS,
    ),
)
ROUNDS_PROPOSE = ("propose",)  # a callee whose name contains one of these proposes the next round
ROUNDS_LAUNCH = ("launch", "execute", "resume")  # ... and one of these launches runs


@dataclass
class Function:
    name: str  # module.function (module.Class.method, module.outer.inner), without "scalelab."
    path: Path
    line: int
    lines: int
    refs: set[str]  # the functions of the index it names (calls or passes on), resolved through imports
    node: ast.AST


def _bindings(mod: str, is_pkg: bool, tree: ast.Module) -> dict[str, str]:
    """Name -> what it stands for in the module: its imports (anywhere in the file) and its top-level defs."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head = alias.name.split(".")[0]
                names[alias.asname or head] = alias.name if alias.asname else head
        elif isinstance(node, ast.ImportFrom):
            base = absolute_from(mod, is_pkg, node)
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = f"{mod}.{node.name}"
    return {k: short(v) for k, v in names.items()}


def _dotted(node: ast.AST) -> str | None:
    """a.b.c for a Name or a chain of Attributes on a Name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _references(body: ast.AST, names: dict[str, str]) -> set[str]:
    refs = set()
    for node in ast.walk(body):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node)
            head, _, rest = (dotted or "").partition(".")
            if head in names:
                refs.add(names[head] + (f".{rest}" if rest else ""))
    return refs


def _index_file(index: dict[str, Function], path: Path, mod: str) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = _bindings(mod, path.name == "__init__.py", tree)
    top = ast.Module(body=[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))])
    name = f"{short(mod)}.<module>"
    index[name] = Function(name, path, 1, 0, _references(top, names), top)
    todo: list[tuple[ast.AST, str]] = [(tree, short(mod))]
    while todo:
        node, prefix = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                lines = child.end_lineno - child.lineno + 1
                index[name] = Function(name, path, child.lineno, lines, _references(child, names), child)
                todo.append((child, name))
            else:
                todo.append((child, f"{prefix}.{child.name}" if isinstance(child, ast.ClassDef) else prefix))


def function_index(root: Path, package: tuple[str, ...], folders: tuple[str, ...]) -> dict[str, Function]:
    """Every function under `folders` (and each module's top-level code, as `module.<module>`)."""
    index: dict[str, Function] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            _index_file(index, path, module_name(root, path, package))
    for f in index.values():
        f.refs = {r for r in f.refs if r in index and r != f.name}
    return index


def long_functions(index: dict[str, Function], over: int) -> list[Function]:
    return sorted((f for f in index.values() if f.lines > over), key=lambda f: (-f.lines, f.name))


def _reaches(index: dict[str, Function], start: str, targets: set[str]) -> str | None:
    """A target that `start` reaches through the functions it references (not through tests)."""
    seen, todo = {start}, [start]
    while todo:
        for ref in index[todo.pop()].refs:
            if ref in targets:
                return ref
            if ref not in seen and not ref.startswith("tests."):
                seen.add(ref)
                todo.append(ref)
    return None


def where(root: Path, f: Function) -> str:
    return f"{f.path.relative_to(root)}:{f.line}"


def _body_nodes(node: ast.AST):
    """The nodes of a function's own body, not looking into nested functions, lambdas or classes."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _json_keys(node: ast.AST) -> set[str] | None:
    """The string keys a function reads (x["k"], x.get("k")) when it parses JSON, else None."""
    parses, keys = False, set()
    for n in _body_nodes(node):
        if isinstance(n, ast.Call) and _dotted(n.func) in ("json.load", "json.loads"):
            parses = True
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            keys.add(n.slice.value)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args:
            if isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
                keys.add(n.args[0].value)
    return keys if parses else None


def _by_shape(index: dict[str, Function], role: Role, known: list[str]) -> list[str]:
    """Functions (tests excluded) not in the role's list that parse JSON and read its keys (Role.shape)."""
    found = []
    for f in index.values():
        if not role.shape or f.name in known or f.name.startswith("tests."):
            continue
        keys = _json_keys(f.node)
        if keys is not None and any(set(s.split("+")) <= keys for s in role.shape):
            found.append(f.name)
    return found


def role_report(root: Path, index: dict[str, Function], role: Role) -> tuple[list[str], int]:
    """(lines of text, how many of the role's functions are entries) for `role`: its listed functions
    and the unlisted ones of its shape (Role.shape)."""
    known = [short(k) for k in role.known]
    shaped = _by_shape(index, role, known)
    present = {k for k in known if k in index} | set(shaped)
    lines, entries = [], 0
    for k in known + shaped:
        if k not in present:
            lines.append(f"  {k:<52} not in this checkout")
            continue
        f = index[k]
        via = _reaches(index, k, present - {k})
        entries += via is None
        callers = sorted(c.name for c in index.values() if k in c.refs and not c.name.startswith("tests."))
        tests = {c.path for c in index.values() if k in c.refs and c.name.startswith("tests.")}
        how = f"calls {via}" if via else "an entry"
        how += " (not listed: found by its shape)" if k in shaped else ""
        lines.append(f"  {k:<52} {where(root, f)}  {f.lines} lines; {how}")
        lines.append(f"      called by {', '.join(callers) or 'nothing'}; named in {len(tests)} test file(s)")
    return lines, entries


def _callees(node: ast.AST) -> list[str]:
    """The simple names of the callees in `node`, not looking into nested function definitions."""
    out = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(n, ast.Call) and (dotted := _dotted(n.func)):
            out.append(dotted.rsplit(".", 1)[-1])
        todo.extend(ast.iter_child_nodes(n))
    return out


def _is_rounds_loop(loop: ast.AST) -> bool:
    calls = _callees(loop)
    proposes = any(p in c for c in calls for p in ROUNDS_PROPOSE)
    return proposes and any(q in c for c in calls for q in ROUNDS_LAUNCH)


def rounds_loops(index: dict[str, Function]) -> list[Function]:
    """Functions (tests excluded) with a for/while loop whose body proposes a round and launches runs."""
    found = []
    for f in index.values():
        if f.name.startswith("tests."):
            continue
        todo = list(ast.iter_child_nodes(f.node))
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(n, (ast.For, ast.While, ast.AsyncFor)) and _is_rounds_loop(n):
                found.append(f)
                break
            todo.extend(ast.iter_child_nodes(n))
    return found
