"""A sweep's own files (specs, rounds, fits) read the same way from a local directory or object storage.

    spec = files.join(sweep_dir, "rounds", "round_1.yaml")   # a Path, or an s3:// URL
    files.read_text(spec)                                    # None when there is none
    files.names(files.join(sweep_dir, "fits"), "round_", ".json")   # ["round_1.json", ...]

The closed loop (scalelab.sweeps.closed_loop.propose, proposal, rounds) addresses its files through these, so
`sweep next` and `--rounds` run unchanged on either kind of store; writes go through
scalelab.store.atomic (whole files; conditional where two drivers may race).
"""

from __future__ import annotations

from pathlib import Path

from scalelab.store import objects


def join(base: str | Path, *parts: str) -> str | Path:
    return objects.join(base, *parts) if objects.is_url(base) else Path(base).joinpath(*parts)


def read_bytes(path: str | Path) -> bytes | None:
    if objects.is_url(path):
        return objects.read_bytes(path)
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


def read_text(path: str | Path) -> str | None:
    data = read_bytes(path)
    return None if data is None else data.decode()


def exists(path: str | Path) -> bool:
    return objects.exists(path) if objects.is_url(path) else Path(path).is_file()


def names(folder: str | Path, prefix: str, suffix: str) -> list[str]:
    """Names of the files directly in `folder` that start with prefix and end with suffix, sorted."""
    if objects.is_url(folder):
        found = [rel for rel in objects.list_objects(folder) if "/" not in rel]
    else:
        found = [p.name for p in Path(folder).iterdir() if p.is_file()] if Path(folder).is_dir() else []
    return sorted(n for n in found if n.startswith(prefix) and n.endswith(suffix))


def stem(path: str | Path) -> str:
    """The file name without its extension (`round_1` of `.../rounds/round_1.yaml`)."""
    return Path(objects.name(path) if objects.is_url(path) else path).stem
