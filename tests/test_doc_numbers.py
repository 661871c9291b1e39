"""Numbers quoted in the guides come from the code or sit in a marked, dated result (docs/results/README.md).

A guide (docs/*.md outside docs/results/, README.md) says how things work. A measured-looking number in
it (a decimal with two or more digits after the point, or a percentage with a decimal: 1.3674,
0.58%, +1.80%) must be one of:
  - in the code: the literal appears in the package's source (a constant, a default);
  - in a marked result: a paragraph that starts with `Measured (YYYY-MM-DD ...` (or a heading that
    starts with `Measured` and carries a date, for its whole section), and the code block or table
    right after such a paragraph;
  - beside a link to a generated page: a paragraph that links to results/NAME.md (or the table or
    code block right after it), where the number also appears in that page (so a quote cannot drift
    from what the command wrote).
Every guide holds to it: the 1,264 unmarked numbers the guides held when the rule came in were
moved to docs/results/, linked, marked or said as the code says them, the last on 2026-12-07.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.closed_loop.propose import propose_next

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = (
    "analysis",
    "cli",
    "fitting",
    "kernels",
    "models",
    "parallel",
    "planning",
    "scalelab",
    "store",
    "sweeps",
    "train",
)
_NUMBER = re.compile(r"(?<![\w.])[+-]?\d+\.\d+%|(?<![\w.])\d+\.\d{2,}(?![\w.]*\d)")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MARK = re.compile(r"^(\*\*)?Measured\b")
_HEADING = re.compile(r"^(#+)\s+(.*)")
_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+")
_RESULT_LINK = re.compile(r"(?:docs/)?results/([\w.-]+\.md)")


def guides() -> list[pathlib.Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def numbers(text: str) -> list[str]:
    return [m.lstrip("+-").rstrip("%") for m in _NUMBER.findall(text)]


def blocks(text: str) -> list[tuple[int, str, bool]]:
    """(first line, text, marked) per paragraph: fenced code is one block; a marked heading marks its section."""
    out: list[tuple[int, str, bool]] = []
    cur: list[str] = []
    start, fence, section_mark = 0, False, None  # section_mark: the marked heading's level
    after_mark = False

    def flush():
        nonlocal cur, after_mark
        if not cur:
            return
        body = "\n".join(cur)
        first = cur[0].strip()
        own = bool(_MARK.match(first) and _DATE.search(body))
        code = first.startswith(("```", "|")) or cur[0].startswith("    ")
        marked = own or section_mark is not None or (after_mark and code)
        out.append((start, body, marked))
        after_mark = own or (after_mark and code)
        cur = []

    for i, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            if not fence:
                flush()
                start = i
            fence = not fence
            cur.append(line)
            if not fence:
                flush()
            continue
        if fence:
            cur.append(line)
            continue
        h = _HEADING.match(line)
        if h:
            flush()
            level = len(h.group(1))
            if section_mark is not None and level <= section_mark:
                section_mark = None
            if section_mark is None and _MARK.match(h.group(2)) and _DATE.search(h.group(2)):
                section_mark = level
            after_mark = False
            continue
        if not line.strip():
            flush()
            continue
        if not cur:
            start = i
        cur.append(line)
    flush()
    return out


def code_numbers() -> set[str]:
    """Every decimal literal in the package's source and pyproject.toml (the Python floor, pinned versions)."""
    files = [p for d in PACKAGE for p in (ROOT / d).rglob("*.py")] + [ROOT / "pyproject.toml"]
    return {n for p in files for n in _DECIMAL.findall(p.read_text())}


def unmarked(path: pathlib.Path, code: set[str]) -> list[str]:
    """'page:line: number' for every number that is neither in the code nor marked nor in a linked page."""
    found: list[str] = []
    linked: set[str] = set()
    for line, body, marked in blocks(path.read_text()):
        if marked:
            continue
        pages = [ROOT / "docs" / "results" / n for n in _RESULT_LINK.findall(body)]
        if pages or not body.startswith(("```", "|", "    ")):  # a table or code block keeps its lead's pages
            linked = {n for p in pages if p.exists() for n in _DECIMAL.findall(p.read_text())}
        for n in numbers(body):
            if n not in code and n not in linked:
                found.append(f"{path.relative_to(ROOT)}:{line}: {n}")
    return found


def test_blocks_and_numbers_are_read_as_the_docstring_says():
    text = "Intro 1.25 and 3.5%.\n\nMeasured (2026-12-07, `cmd`): 1.3674\n\n    out 0.58%\n\nprose 2.75\n"
    assert [(b[0], b[2]) for b in blocks(text)] == [(1, False), (3, True), (5, True), (7, False)]
    assert numbers("1.3674 [0.8933, 2.0930], +1.80%, 0.1.0, 3.5%, 12, 2e12, v1.25.3") == [
        "1.3674", "0.8933", "2.0930", "1.80", "3.5",
    ]  # fmt: skip
    sec = "## Measured 2026-12-01 (`cmd`)\n\n9.99\n\n### sub\n\n8.88\n\n## Method\n\n7.77\n"
    assert [b[2] for b in blocks(sec)] == [True, True, False]


def test_guides_quote_numbers_from_the_code_or_a_marked_result():
    code = code_numbers()
    found = [n for path in guides() for n in unmarked(path, code)]
    assert not found, "mark them as dated results or move them to docs/results/: " + "; ".join(found)


def test_the_demo_page_says_how_it_was_made_and_its_generator_refuses_what_is_no_demo_store(tmp_path, capsys):
    head = (ROOT / "docs" / "results" / "demo.md").read_text().splitlines()[:4]
    assert "Generated by `python scripts/demo_results.py " in head[2] and _DATE.search(head[2]), head
    assert "code " in head[2] and "load average" in head[2], head
    spec = importlib.util.spec_from_file_location("demo_results", ROOT / "scripts" / "demo_results.py")
    demo_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_results)  # in this process: the package's imports are the suite's, not a new start-up
    out = tmp_path / "demo.md"
    with pytest.raises(SystemExit) as exit_:
        demo_results.main([str(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "demo_dir" in err, err
    assert not out.exists()


def test_the_demo_page_is_written_from_a_demo_store(tmp_path):
    """A demo store (its IsoFLOP sweep and the proposed run, from a known law: no training): the page
    holds the runs, the fit, the prediction (a first round's: the bracket, its two sides named) and
    the measured loss. The page broke once when the saved-fit readers changed under it."""
    spec = importlib.util.spec_from_file_location("demo_results", ROOT / "scripts" / "demo_results.py")
    demo_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_results)
    sweep = tmp_path / "demo" / demo_results.SWEEP
    raw = demo_spec()
    raw["fit"] = {**raw.get("fit", {}), "bootstrap": 4}
    law = SyntheticLaw(E=1.23, A=1019.0, B=2063.0, alpha=0.817, beta=0.639)  # near the demo's own fit
    launch_synthetic(raw, sweep, law, noise_std=0.003)
    c = 3 * max(raw["isoflop"]["budgets"])  # the demo's next budget
    p = propose_next(sweep, target_flops=c, budget_flops=c, replicates=4, max_runs=1, log=lambda _m: None)
    launch_synthetic(p["spec_path"], sweep, law, noise_std=0.003)
    ledger.score(sweep)
    out = tmp_path / "demo.md"
    demo_results.main([str(tmp_path / "demo"), "--out", str(out)])
    text = out.read_text()
    assert "## The runs" in text and "## The fit" in text and "## Predicted vs measured" in text
    assert all(q["predicted_ends"] for q in p["proposals"])  # past the design's budgets: the bracket
    assert "the prediction is the bracket" in text and "- measured val loss" in text
