"""The design written down inside the repository: every docs/ page a file cites exists, nothing cites a
document from outside the repository, and docs/architecture.md's import table is what the code does."""

import ast
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
# docs/NAME.md not inside another path (a torchtitan page is cited as "torchtitan docs/...md @ <commit>")
_CITED = re.compile(r"(?<![\w./-])docs/((?:results/)?[\w.-]+\.md)(?!`?\s*@\s*[0-9a-f]{7,})")
# a Markdown link's target: [text](target)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# design documents that lived beside the repository, never in it
_OUTSIDE = re.compile(r"ARCHITECTURE\.md|STYLE\.md|SCALING-METHOD\.md|\.\./shared|/work/shared")
_TABLE = re.compile(r"^\| (\w+) \| (.+) \|$")


def _files(*suffixes: str) -> list[pathlib.Path]:
    """The repository's tracked files (untracked ones too, so a new file is checked before its commit)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / f for f in out.splitlines() if f.endswith(suffixes) and (ROOT / f).is_file()]


def cited_pages(text: str) -> set[str]:
    return set(_CITED.findall(text))


def test_cited_pages_are_found_and_external_ones_are_not():
    assert cited_pages('see docs/store.md and docs/architecture.md ("Method")') == {"store.md", "architecture.md"}
    assert cited_pages('TITAN = "torchtitan docs/performance.md @ 4d88a8a4"') == set()
    assert cited_pages("torchtitan `docs/performance.md` @ 4d88a8a44fe4") == set()
    assert cited_pages("bench/docs/x.md, https://a.io/docs/y.md") == set()
    assert cited_pages("docs/results/demo.md") == {"results/demo.md"}


def test_every_relative_link_in_the_docs_leads_to_a_file():
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in _LINK.findall(path.read_text()):
            target = target.split("#")[0]
            if target and not re.match(r"[a-z]+:", target) and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to nothing: {broken}"


def test_every_docs_page_a_file_cites_exists():
    missing = []
    for path in _files(".py", ".md", ".yaml", ".yml", ".toml", ".txt"):
        if path == pathlib.Path(__file__).resolve():
            continue
        for page in sorted(cited_pages(path.read_text(errors="replace"))):
            if not (ROOT / "docs" / page).exists():
                missing.append(f"{path.relative_to(ROOT)} cites docs/{page}")
    assert not missing, "; ".join(missing)


def test_no_file_cites_a_document_outside_the_repository():
    found = []
    for path in _files(".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg"):
        if path == pathlib.Path(__file__).resolve():
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}")
    assert not found, f"cites a document outside the repository: {found}"


def import_rules() -> dict[str, set[str]]:
    """docs/architecture.md's "Who may import whom" table: folder -> the folders it may import."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Who may import whom", 1)[1].split("\n## ", 1)[0]
    rules = {}
    for line in section.splitlines():
        m = _TABLE.match(line.strip())
        if m and m.group(1) != "folder":
            allowed = m.group(2).strip()
            rules[m.group(1)] = set() if allowed.startswith("(") else {a.strip() for a in allowed.split(",")}
    return rules


def imports_of_ours(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, folder) for every `scalelab.<folder>` import in a file, in functions too."""
    folders = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "scalelab" else [f"scalelab.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "scalelab":
                folder = parts[1] if len(parts) > 1 and (ROOT / parts[1] / "__init__.py").exists() else "scalelab"
                folders.append((node.lineno, folder))
    return folders


def test_the_import_table_is_what_the_code_does():
    rules = import_rules()
    folders = (
        "scalelab",
        "store",
        "kernels",
        "models",
        "parallel",
        "train",
        "fitting",
        "sweeps",
        "planning",
        "analysis",
        "cli",
    )
    assert set(rules) == set(folders)
    assert rules["store"] == {"scalelab"} and "train" not in rules["fitting"]
    broken = []
    for folder, allowed in rules.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, imported in imports_of_ours(path):
                if imported != folder and imported not in allowed:
                    broken.append(f"{path.relative_to(ROOT)}:{line} imports scalelab.{imported}")
    assert not broken, "imports docs/architecture.md does not allow: " + "; ".join(broken)


_SUB_ROW = re.compile(r"^\| `(\w+)/(\w+)` \| .+ \| (.+) \|$")


def subpackage_rules() -> dict[tuple[str, str], set[str]]:
    """docs/architecture.md's "Inside fitting/ and sweeps/" table: (floor, sub-package) -> the sub-packages
    of its floor it may import."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Inside fitting/ and sweeps/", 1)[1].split("\n## ", 1)[0]
    rules = {}
    for line in section.splitlines():
        m = _SUB_ROW.match(line.strip())
        if m:
            allowed = m.group(3).strip()
            rules[m.group(1), m.group(2)] = (
                set() if allowed.startswith("(") else {a.strip() for a in allowed.split(",")}
            )
    return rules


def test_the_subpackage_table_is_what_the_code_does():
    rules = subpackage_rules()
    found = {
        (p.parent.parent.name, p.parent.name) for f in ("fitting", "sweeps") for p in (ROOT / f).glob("*/__init__.py")
    }
    assert set(rules) == found, (
        f"sub-packages the table lacks: {found - set(rules)}; rows without one: {set(rules) - found}"
    )
    broken = []
    for (floor, sub), allowed in rules.items():
        for path in sorted((ROOT / floor / sub).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    parts = name.split(".")
                    if parts[:2] == ["scalelab", floor] and len(parts) > 2 and parts[2] not in (sub, *allowed):
                        broken.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not broken, "imports docs/architecture.md's sub-package table does not allow: " + "; ".join(broken)
