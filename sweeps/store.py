"""The sweep store: run records on disk, read back as one polars frame.

Layout (ARCHITECTURE.md), one directory per sweep:

    <root>/<sweep>/sweep.yaml             the spec as given (later rounds: rounds/<name>.yaml)
    <root>/<sweep>/sweep.resolved.json    every run of every round: id, config, labels, N, D, C
    <root>/<sweep>/runs/<run_id>/         config.json, status.json, metrics.parquet, evals.parquet,
                                          checkpoints/step_N/ (written by scalelab.train)
    <root>/<sweep>/events.jsonl           one line per trial start / end / failure (append-only)
    <root>/<sweep>/fits/<name>.json       fits made by `sweep next` (one per round)

Every file is written to a temporary name and renamed over the target (scalelab.train.records),
so a scan never meets a half-written Parquet or JSON file whatever happens to the writer.

Store root and dedupe: the *store root* is the directory that holds the sweep directories (the
parent of `--out`). Runs are addressed by the hash of their resolved config, and each run has one
directory per store root: the first sweep to start a run claims it (`<root>/.claims/<run_id>`, an
atomic symlink to its run directory, see claim_run), and every other sweep links its
`runs/<id>` there (`../../<other>/runs/<id>`, a relative symlink). Whoever trains a run holds that
directory's lock, so sibling sweeps launched together train each run once: the second waits for
the first and finds it done (or, if the first died, resumes it from its checkpoints). Runs that
are `done` anywhere in the root from before claims existed are linked the same way. Ids change
when the code gains a config field; `renamed_runs` re-resolves stored configs so a finished run is
still found under its new id (and listed once by load_runs).

    from scalelab.sweeps.store import load_runs
    df = load_runs("results/isoflop")        # one row per run (a sweep dir or a whole store root)
    df.filter(pl.col("status") == "done").select("params", "tokens", "flops", "loss")

Object storage (`--out s3://bucket/prefix/sweep`, scalelab.train.storage): the same layout as
objects, each written whole (no temporary names, no rename). Events are one object each
(`events/<time>-<id>.json`: there is no append). A run is trained under a lease instead of a lock
(scalelab.sweeps.lease) in a node-local copy synced to the store. Not done there: linking runs of
sibling sweeps (claims are symlinks), cooldown branches (they load another run's checkpoint by
path), multi-process runs (their workers may sit on other nodes than the copy), `sweep next`.
Readers load a local copy of the records (storage.local_view).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from scalelab.errors import UsageError
from scalelab.parallel.config import ParallelConfig
from scalelab.train import storage
from scalelab.train.config_tree import from_dict
from scalelab.train.records import atomic_write_bytes, atomic_write_json, read_status

TERMINAL = ("done", "diverged", "stopped_early")  # states a run never leaves; anything else is (re)started
RESOLVED = "sweep.resolved.json"


def location(sweep_dir: str | Path) -> str | Path:
    """A sweep's address: an object-storage URL as given, a local path made absolute."""
    return sweep_dir if storage.is_url(sweep_dir) else Path(sweep_dir).resolve()


def runs_dir(sweep_dir: str | Path) -> Path:
    return storage.join(sweep_dir, "runs") if storage.is_url(sweep_dir) else Path(sweep_dir) / "runs"


def run_path(sweep_dir: str | Path, run_id: str) -> Path:
    return storage.join(sweep_dir, "runs", run_id) if storage.is_url(sweep_dir) else runs_dir(sweep_dir) / run_id


def is_sweep_dir(path: str | Path) -> bool:
    if storage.is_url(path):
        return storage.exists(storage.join(path, "sweep.yaml"))
    return (Path(path) / "sweep.yaml").is_file()


def tune_dir(sweep_dir: str | Path) -> Path:
    """Ray Tune's own state (the store is the sweep's state): beside the sweep, or local to the
    driver for a sweep on object storage."""
    if storage.is_url(sweep_dir):
        return Path(tempfile.mkdtemp(prefix="scalelab-tune-"))
    return Path(sweep_dir) / ".tune"


def run_state(run_dir: str | Path) -> str:
    """pending (nothing on disk) | running | done | failed | diverged, from status.json."""
    try:
        status = read_status(run_dir)
    except (OSError, json.JSONDecodeError):
        return "pending"
    return (status or {}).get("status", "pending")


# ---------------------------------------------------------------------------------------------
# Writing a sweep
# ---------------------------------------------------------------------------------------------


def init_sweep(sweep_dir: str | Path, spec_text: str, spec_name: str, runs: list[dict], name: str) -> str:
    """Create or extend a sweep directory; returns the spec's file name relative to the sweep.

    A new directory gets sweep.yaml. Launching another spec into an existing sweep (a later round
    from `sweep next`) stores it under rounds/ and appends its runs to sweep.resolved.json.
    """
    if storage.is_url(sweep_dir):
        return _init_object_sweep(sweep_dir, spec_text, runs, name)
    sweep_dir = Path(sweep_dir)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise UsageError(f"--out {sweep_dir} is a file; give a sweep directory (new, or one to extend)")
    if sweep_dir.exists() and not is_sweep_dir(sweep_dir) and any(sweep_dir.iterdir()):
        raise UsageError(f"--out {sweep_dir} exists and is not a sweep directory; choose an empty or new one")
    runs_dir(sweep_dir).mkdir(parents=True, exist_ok=True)
    if not is_sweep_dir(sweep_dir):
        atomic_write_bytes(sweep_dir / "sweep.yaml", spec_text.encode())
        rel = "sweep.yaml"
    elif (sweep_dir / "sweep.yaml").read_text() == spec_text:
        rel = "sweep.yaml"
    else:
        rel = f"rounds/{spec_name}.yaml"
        existing = sweep_dir / rel
        if existing.exists() and existing.read_text() != spec_text:
            raise UsageError(f"{existing} holds a different spec of the same name; rename the spec file")
        atomic_write_bytes(existing, spec_text.encode())
    resolved = read_resolved(sweep_dir)
    resolved.setdefault("name", name)
    specs = resolved.setdefault("specs", [])
    if rel not in specs:
        specs.append(rel)
    known = {r["run_id"] for r in resolved.setdefault("runs", [])}
    for r in runs:
        if r["run_id"] not in known:
            resolved["runs"].append(dict(r, spec=rel))
            known.add(r["run_id"])
    atomic_write_json(sweep_dir / RESOLVED, resolved)
    return rel


def _init_object_sweep(url: str, spec_text: str, runs: list[dict], name: str) -> str:
    """init_sweep on object storage: every check before the first object is written."""
    storage.check(url, "--out")
    if (yaml.safe_load(spec_text) or {}).get("early_stop"):
        raise UsageError(f"--out {url}: early_stop is not supported on s3:// stores yet; use a shared POSIX path")
    for r in runs:
        world = from_dict(ParallelConfig, r["config"].get("parallel") or {}, "parallel").world_size
        if world > 1 or r.get("depends_on"):
            what = "a multi-process layout" if world > 1 else f"a cooldown branch of {r['depends_on']}"
            raise UsageError(
                f"--out {url}: run {r['run_id']} is {what}, which s3:// stores do not run yet; "
                "use a shared POSIX path (NFS/Lustre) for this sweep"
            )
    spec = storage.read_bytes(storage.join(url, "sweep.yaml"))
    if spec is None and storage.list_objects(url):
        raise UsageError(f"--out {url} holds objects but no sweep.yaml; choose an empty or new prefix")
    if spec is not None and spec.decode() != spec_text:
        raise UsageError(f"--out {url} holds a different sweep; launch into a new prefix (rounds need a local store)")
    if spec is None:
        atomic_write_bytes(storage.join(url, "sweep.yaml"), spec_text.encode())
    resolved = read_resolved(url)
    resolved.setdefault("name", name)
    resolved.setdefault("specs", ["sweep.yaml"])
    known = {r["run_id"] for r in resolved.setdefault("runs", [])}
    resolved["runs"] += [dict(r, spec="sweep.yaml") for r in runs if r["run_id"] not in known]
    write_resolved(url, resolved)
    return "sweep.yaml"


def write_resolved(sweep_dir: str | Path, resolved: dict[str, Any]) -> None:
    target = storage.join(sweep_dir, RESOLVED) if storage.is_url(sweep_dir) else Path(sweep_dir) / RESOLVED
    atomic_write_json(target, resolved)


def read_resolved(sweep_dir: str | Path) -> dict[str, Any]:
    if storage.is_url(sweep_dir):
        data = storage.read_bytes(storage.join(sweep_dir, RESOLVED))
        return {} if data is None else json.loads(data)
    path = Path(sweep_dir) / RESOLVED
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def find_finished_elsewhere(sweep_dir: str | Path, run_id: str) -> Path | None:
    """A terminal copy of run_id in another sweep of the same store root, or None."""
    sweep_dir = Path(sweep_dir).resolve()
    root = sweep_dir.parent
    for other in sorted(root.iterdir()):
        if other == sweep_dir or not is_sweep_dir(other):
            continue
        cand = run_path(other, run_id)
        if cand.is_dir() and not cand.is_symlink() and run_state(cand) in TERMINAL:
            return cand
    return None


def renamed_runs(root: str | Path) -> dict[str, Path]:
    """Terminal runs of the store root whose id changed with the code: {id under today's code: dir}.

    A run's id is the hash of its resolved config, so a new config field (with its default) changes
    every id. Each stored config.json is re-resolved with today's code; if that reproduces a run we
    are about to train, the stored run *is* that run (its stored keys are explicit, so a changed
    default does not match). Costs one config resolution per stored run.
    """
    from scalelab.train.config import build_run_config, config_hash

    index: dict[str, Path] = {}
    for sweep in sorted(p for p in Path(root).iterdir() if is_sweep_dir(p)):
        rdir = runs_dir(sweep)
        for d in sorted(rdir.iterdir()) if rdir.is_dir() else []:
            if d.is_symlink() or not d.is_dir() or run_state(d) not in TERMINAL:
                continue
            try:
                current = config_hash(build_run_config(json.loads((d / "config.json").read_text())))
            except Exception:  # noqa: BLE001 - a config today's code rejects matches nothing
                continue
            if current != d.name:
                index.setdefault(current, d)
    return index


def attach_runs(sweep_dir: str | Path, run_ids: list[str]) -> dict[str, str]:
    """State of each run, linking runs of the store root found elsewhere; {run_id: state}.

    Looked up among the root's claims (a run another sweep trains or trained, see claim_run), by
    id in sibling sweeps (terminal runs), then among runs stored under an older id of the same
    config (see renamed_runs); a match is linked as runs/<id> -> its directory (relative symlink).
    """
    if storage.is_url(sweep_dir):  # no links on object storage: each sweep trains its own runs
        return {run_id: run_state(run_path(sweep_dir, run_id)) for run_id in run_ids}
    sweep_dir = Path(sweep_dir)
    states, renamed = {}, None
    for run_id in run_ids:
        here = run_path(sweep_dir, run_id)
        if not here.exists():
            other = claimed_elsewhere(sweep_dir, run_id) or find_finished_elsewhere(sweep_dir, run_id)
            if other is None:
                renamed = renamed_runs(sweep_dir.resolve().parent) if renamed is None else renamed
                other = renamed.get(run_id)
            if other is not None:
                here.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.path.relpath(other, here.parent), here)
        states[run_id] = run_state(here)
    return states


CLAIMS = ".claims"  # <root>/.claims/<run_id> -> the one physical directory of that run in the root


def claim_run(sweep_dir: str | Path, run_id: str) -> Path:
    """This sweep's directory for run_id, made the store root's one copy of that run; returns runs/<id>.

    The first sweep of the root to claim a run creates `<root>/.claims/<run_id>`, a symlink to its
    own run directory (os.symlink is atomic: of two sibling sweeps launched together exactly one
    wins); every other sweep links its runs/<id> to that directory. So a run has one directory,
    one lock and one training per store root; whoever trains it holds its lock. A run directory
    that already holds progress of its own is kept (copies made before claims existed), and a
    claim whose directory is gone (a deleted sweep) is taken over.
    """
    sweep_dir = Path(sweep_dir).absolute()
    here = run_path(sweep_dir, run_id)
    if here.is_symlink():
        return here
    claims = sweep_dir.parent / CLAIMS
    claims.mkdir(exist_ok=True)
    claim = claims / run_id
    here.mkdir(parents=True, exist_ok=True)  # before the claim: a claim always points at a directory
    for _ in range(3):
        try:
            os.symlink(os.path.relpath(here, claims), claim)
            return here
        except FileExistsError:
            pass
        owner = (claims / os.readlink(claim)).resolve() if claim.is_symlink() else None
        if owner == here.resolve():
            return here
        if owner is not None and owner.is_dir():
            if any(here.iterdir()):
                return here  # progress of its own: never thrown away
            here.rmdir()
            os.symlink(os.path.relpath(owner, here.parent), here)
            return here
        stale = claims / f".{run_id}.{os.getpid()}.tmp"  # the claimed directory is gone: take over
        stale.unlink(missing_ok=True)
        os.symlink(os.path.relpath(here, claims), stale)
        os.replace(stale, claim)
    return here


def claimed_elsewhere(sweep_dir: str | Path, run_id: str) -> Path | None:
    """The directory of run_id claimed by another sweep of the root, if any (see claim_run)."""
    sweep_dir = Path(sweep_dir).absolute()
    claim = sweep_dir.parent / CLAIMS / run_id
    if not claim.is_symlink():
        return None
    owner = (claim.parent / os.readlink(claim)).resolve()
    if owner.is_dir() and owner != run_path(sweep_dir, run_id).resolve():
        return owner
    return None


def append_event(sweep_dir: str | Path, event: str, run_id: str, **fields: Any) -> None:
    """One JSON line in events.jsonl; a single O_APPEND write, so concurrent trials never interleave."""
    line = json.dumps(dict(event=event, run_id=run_id, time=time.time(), pid=os.getpid(), **fields))
    if storage.is_url(sweep_dir):  # no append on object storage: one object per event
        event_name = f"{time.time():.6f}-{uuid.uuid4().hex[:8]}.json"  # sorts by time
        storage.write_bytes(storage.join(sweep_dir, "events", event_name), line.encode())
        return
    fd = os.open(Path(sweep_dir) / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_events(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The events of a sweep, oldest first (events.jsonl, or one object each from object storage)."""
    if storage.is_url(sweep_dir):
        sweep_dir = storage.local_view(sweep_dir)
    path = Path(sweep_dir) / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    objects = Path(sweep_dir) / "events"
    lines += [p.read_text() for p in sorted(objects.glob("*.json"))] if objects.is_dir() else []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a killed writer
    return out


# ---------------------------------------------------------------------------------------------
# Reading: one row per run
# ---------------------------------------------------------------------------------------------

_HYPER = {  # column -> path in the resolved config
    "lr": ("optim", "lr"),
    "weight_decay": ("optim", "weight_decay"),
    "beta2": ("optim", "beta2"),
    "schedule": ("schedule", "name"),
    "global_batch_tokens": ("train", "global_batch_tokens"),
    "seq_len": ("data", "seq_len"),
    "seed": ("train", "seed"),
    "num_layers": ("model", "num_layers"),
    "d_model": ("model", "d_model"),
    "parametrization": ("model", "parametrization"),
    "num_heads": ("model", "num_heads"),
    "num_kv_heads": ("model", "num_kv_heads"),
    "d_ff": ("model", "d_ff"),
    "vocab_size": ("model", "vocab_size"),
    "tokenizer": ("data", "tokenizer"),
    "init_from": ("train", "init_from"),
}
_LABELS = (
    "generator",
    "spec",
    "flops_budget",
    "tokens_per_param",
    "cooldown",
    "branch_of",
    "branch_step",
    "round",
    "proposal",
    "sample",
    "mixture",
    "epochs",
    "unique_tokens",
    "arm",
)


def _get(tree: dict, path: tuple[str, ...]) -> Any:
    for p in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(p)
    return tree


def last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.parquet"
    if not path.exists():
        return 0
    try:
        return int(pl.read_parquet(path, columns=["step"])["step"].max() or 0)
    except Exception:  # noqa: BLE001 - an unreadable file counts as no progress (never a crash)
        return 0


def _final_evals(run_dir: Path) -> dict[str, float]:
    path = run_dir / "evals.parquet"
    if not path.exists():
        return {}
    try:
        df = pl.read_parquet(path)
    except Exception:  # noqa: BLE001
        return {}
    if df.is_empty():
        return {}
    last = df.filter(pl.col("step") == df["step"].max())
    return {f"eval/{r['task']}/{r['metric']}": r["value"] for r in last.iter_rows(named=True)}


def _row(run_dir: Path, sweep: str, entry: dict[str, Any]) -> dict[str, Any]:
    status = {}
    try:
        status = read_status(run_dir) or {}
    except (OSError, json.JSONDecodeError):
        pass
    config = entry.get("config")
    if config is None and (run_dir / "config.json").exists():
        config = json.loads((run_dir / "config.json").read_text())
    config = config or {}
    labels = entry.get("labels") or {}
    num_steps = status.get("num_steps")
    if num_steps is None and config:
        tps = config["train"]["global_batch_tokens"] // config["data"]["seq_len"] * config["data"]["seq_len"]
        num_steps = config["train"]["num_tokens"] // tps
    step = last_step(run_dir)
    final_val = status.get("final_val_loss")
    row = dict(
        run_id=run_dir.name,
        sweep=sweep,
        status=status.get("status", "pending"),
        step=step,
        num_steps=num_steps,
        progress=(step / num_steps) if num_steps else None,
        attempts=status.get("attempts", 0),
        params=status.get("params", entry.get("params")),
        params_nonembed=status.get("params_nonembed", entry.get("params_nonembed")),
        tokens=status.get("num_tokens", entry.get("num_tokens")),
        flops=status.get("flops_6n", entry.get("flops_6n")),
        flops_exact=status.get("flops_exact", entry.get("flops_exact")),
        cost_flops=entry.get("cost_flops", status.get("flops_6n")),
        final_train_loss=status.get("final_train_loss"),
        best_train_loss=status.get("best_train_loss"),
        final_val_loss=final_val,
        best_val_loss=status.get("best_val_loss"),
        final_val_bpb=status.get("final_val_bpb"),
        loss=final_val if final_val is not None else status.get("final_train_loss"),
        predicted_loss=status.get("predicted_loss"),  # stopped_early runs (sweeps/early_stop.py)
        stopped_fraction=status.get("stopped_fraction"),
        error=status.get("error") or status.get("reason"),
        updated_at=status.get("updated_at"),
        tags=json.dumps(dict(config.get("tags") or {}, **{k: str(v) for k, v in labels.items()}), sort_keys=True),
    )
    for col in _LABELS:
        row[col] = labels.get(col) if col != "spec" else entry.get("spec")
    for col, path in _HYPER.items():
        row[col] = _get(config, path)
    row.update(_final_evals(run_dir))
    return row


def _sweep_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    resolved = read_resolved(sweep_dir)
    entries = {r["run_id"]: r for r in resolved.get("runs", [])}
    rdir = runs_dir(sweep_dir)
    on_disk = sorted(p.name for p in rdir.iterdir() if not p.name.startswith(".")) if rdir.is_dir() else []
    ids = list(entries) + [i for i in on_disk if i not in entries]
    rows, seen = [], set()
    for i in ids:
        # One physical run can sit under two ids (linked after the code added config fields): once.
        real = os.path.realpath(rdir / i) if (rdir / i).exists() else str(rdir / i)
        if real in seen:
            continue
        seen.add(real)
        rows.append(_row(rdir / i, sweep_dir.name, entries.get(i, {})))
    return rows


def load_runs(path: str | Path) -> pl.DataFrame:
    """One row per run of a sweep directory, or of every sweep under a store root.

    Columns: run_id, sweep, status, step/num_steps/progress, attempts, params, params_nonembed,
    tokens, flops (6ND), flops_exact, cost_flops, final/best train and val losses, final_val_bpb,
    loss (final val loss, else final train loss), error, tags (JSON), design labels (generator,
    flops_budget, tokens_per_param, cooldown, branch_of, ...), hyperparameters (lr, batch, shape,
    seed, ...) and the last value of every eval as `eval/<task>/<metric>`. In a store root a run
    linked into several sweeps appears once. `path` may be an object-storage URL.
    """
    path = storage.local_view(path) if storage.is_url(path) else Path(path)
    if is_sweep_dir(path) or (path / RESOLVED).exists():
        rows = _sweep_rows(path)
    elif path.is_dir():
        rows, seen = [], set()
        for sweep in sorted(p for p in path.iterdir() if is_sweep_dir(p)):
            for row in _sweep_rows(sweep):
                if row["run_id"] not in seen:
                    seen.add(row["run_id"])
                    rows.append(row)
        if not rows and not any(is_sweep_dir(p) for p in path.iterdir()):
            raise UsageError(f"{path} is neither a sweep directory nor a store root holding sweeps")
    else:
        raise UsageError(f"{path} does not exist")
    if not rows:
        return pl.DataFrame({"run_id": [], "status": []}, schema={"run_id": pl.Utf8, "status": pl.Utf8})
    return pl.DataFrame(rows, infer_schema_length=None)


def export_table(path: str | Path, out: str | Path, *, done_only: bool = True) -> int:
    """Write load_runs(path) as CSV (or Parquet by suffix) for the fitter; returns the row count."""
    df = load_runs(path)
    if done_only and "status" in df.columns:
        df = df.filter(pl.col("status") == "done")
    out = Path(out)
    if out.suffix == ".parquet":
        from scalelab.train.records import atomic_write_parquet

        atomic_write_parquet(out, df)
    else:
        import io

        buf = io.StringIO()
        df.select([c for c in df.columns if df[c].dtype != pl.Null]).write_csv(buf)
        atomic_write_bytes(out, buf.getvalue().encode())
    return df.height
