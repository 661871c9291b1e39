"""The keys of a run config that name files on the machine that trains it, and the check that a config
read from a store names only files the person launching gave.

    local_paths(tree)                        # [("data.sources[0].path", "/data/shards"), ...]
    given = given_paths(trees)               # the paths of the configs a user's own spec resolved to
    check_local_paths(tree, given, where)    # UsageError unless each path is given (or in the store)

Four keys name local files: `data.sources[i].path` (unless "default", the bundled corpus),
`data.tokenizer` (unless "byte"), `train.init_from`, and each `eval.tasks` entry other than
"bundled:NAME" (a JSONL path, or "olmes:" a folder or file). Every other string of a run config
is a name, a choice or a pattern (LOCAL_PATH_FIELDS and NOT_PATHS list them all; the `model:` and
`parallel:` sections hold none; tests/test_store_trust.py checks the lists cover the config).

A store's records (sweep.resolved.json, a round's spec, sweep.yaml read back, a run's
config.json) are written by whoever can write the store: a bucket writer is not the person who
launches. So a config read from a store may name a local path only when the launcher's own spec
named the same one (docs/store.md, "Trust"), or when it is a cooldown branch point inside the
store (`../<run id>/checkpoints/step_N`, relative to the run's directory in its sweep).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from scalelab.errors import UsageError

LOCAL_PATH_FIELDS = ("data.sources.path", "data.tokenizer", "train.init_from", "eval.tasks")
NOT_PATHS = (  # strings that never name a file (names, choices, patterns, labels)
    "name",
    "data.sources.name",
    "data.sources.train_exclude",
    "schedule.name",
    "schedule.decay_shape",
    "train.device",
    "train.dtype",
    "logging.wandb",
    "logging.wandb_project",
    "logging.progress",
    "tags",
)
NO_PATH_SECTIONS = ("model", "parallel")  # architecture and layout: sizes and choices only
_RUN_ID = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
BRANCH_POINT = re.compile(rf"^\.\./{_RUN_ID}/checkpoints/step_\d+$")  # a cooldown's stable run, in the store


def local_paths(tree: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, value) of every local path a resolved run config tree names, in a fixed order."""
    data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    train = tree.get("train") if isinstance(tree.get("train"), dict) else {}
    evals = tree.get("eval") if isinstance(tree.get("eval"), dict) else {}
    out = []
    for i, src in enumerate(data.get("sources") or []):
        path = src.get("path", "default") if isinstance(src, dict) else src
        if path != "default":
            out.append((f"data.sources[{i}].path", path))
    if data.get("tokenizer", "byte") != "byte":
        out.append(("data.tokenizer", data["tokenizer"]))
    if train.get("init_from") is not None:
        out.append(("train.init_from", train["init_from"]))
    for j, task in enumerate(evals.get("tasks") or []):
        if not (isinstance(task, str) and task.startswith("bundled:")):
            out.append((f"eval.tasks[{j}]", task))
    return out


def given_paths(trees: Iterable[dict[str, Any]]) -> frozenset[str]:
    """Every local path the given config trees name (the launcher's own spec, resolved)."""
    return frozenset(str(value) for tree in trees for _, value in local_paths(tree))


def in_store(key: str, value: Any) -> bool:
    """A cooldown branch point: its stable run's checkpoint, a sibling of the run in the store."""
    return key == "train.init_from" and isinstance(value, str) and bool(BRANCH_POINT.match(value))


def check_local_paths(tree: dict[str, Any], given: frozenset[str], where: str) -> None:
    """Raise UsageError (one line) when the config read from `where` names a local path that is neither
    in `given` (the paths of the launcher's own spec) nor a branch point inside the store."""
    for key, value in local_paths(tree):
        if not in_store(key, value) and (not isinstance(value, str) or value not in given):
            raise UsageError(
                f"{where}: {key}={value!r} is a local path that only the store's records name; a store may not "
                "choose files for workers to read (docs/store.md, Trust). If it is yours, name it in the spec "
                "you launch, or give that spec (sweep resume/eval DIR --spec SPEC)"
            )
