"""Where a sweep store lives: a local or shared POSIX path, or object storage (`s3://bucket/prefix`).

    from scalelab.store import objects
    objects.is_url("s3://lab/sweeps/iso")              # True; local paths keep their Path code
    objects.write_bytes("s3://lab/sweeps/iso/x.json", b"{}")   # one PutObject: whole or absent
    view = objects.local_view("s3://lab/sweeps/iso")   # a read-only local copy for the readers

Local paths are written to a temporary name and renamed (scalelab.store.atomic). Object storage
has no rename; there every file is one object written by a single request (PutObject, or a
multipart upload, which is also invisible until it completes), so a reader sees the previous
object or the new one, never part of one. Conditional writes (`If-None-Match: *`, `If-Match:
<etag>`) make the run lease (scalelab.store.lease) safe without a lock server.

The client is boto3's; credentials and the endpoint come from the usual AWS environment
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for an S3-compatible server,
AWS_DEFAULT_REGION) or the node's instance role, never from a file a sweep brings. boto3 is the
optional extra `scalelab[s3]`.

Readers (load_runs, `sweep status`, `scalelab fit`, the report) work on `local_view(url)`: the
store's records (not its checkpoints) downloaded whole into a temporary directory, each file with
its object's modification time.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError

SCHEMES = ("s3",)
# Prefixes a reader never needs (checkpoints are large; Tune state and leases are the writer's).
VIEW_SKIP = ("checkpoints/", ".tune/", ".leases/", ".ray_train/")
PRECONDITION_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")

_clients: dict[str, Any] = {}
_checked: set[str] = set()


def is_url(path: Any) -> bool:
    """True for `scheme://...` strings (object storage); a local path is anything else."""
    return isinstance(path, str) and "://" in path


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])


def parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class Location:
    """An object-storage URL split into bucket and key (no leading slash, no trailing one)."""

    bucket: str
    key: str


def parse(url: str, key: str = "--out") -> Location:
    """Split `s3://bucket/prefix`; UsageError naming `key` for an unknown scheme or no bucket."""
    scheme, _, rest = url.partition("://")
    if scheme not in SCHEMES:
        raise UsageError(f"{key} {url}: unknown scheme '{scheme}://'; give a local path or s3://BUCKET/PREFIX")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise UsageError(f"{key} {url}: no bucket; write s3://BUCKET/PREFIX")
    return Location(bucket, prefix.strip("/"))


def _client():
    """One boto3 S3 client per process, configured from the AWS environment."""
    if "s3" not in _clients:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UsageError("s3:// stores need boto3; pip install 'scalelab[s3]'") from None
        cfg = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60)
        session = boto3.session.Session()
        _clients["credentials"] = session.get_credentials()
        _clients["s3"] = session.client("s3", config=cfg)
    return _clients["s3"]


def check(url: str, key: str = "--out") -> Location:
    """Validate an object-storage URL before anything is written: scheme, bucket, credentials, reach.

    Raises:
        UsageError: one line naming `key`, the value and the fix.
    """
    loc = parse(url, key)
    if loc.bucket in _checked:
        return loc
    client = _client()
    if _clients.get("credentials") is None:
        raise UsageError(
            f"{key} {url}: no AWS credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(and AWS_ENDPOINT_URL for an S3-compatible server)"
        )
    from botocore.exceptions import BotoCoreError, ClientError

    endpoint = client.meta.endpoint_url
    try:
        client.head_bucket(Bucket=loc.bucket)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise UsageError(
                f"{key} {url}: bucket '{loc.bucket}' does not exist at {endpoint}; create it or fix AWS_ENDPOINT_URL"
            ) from None
        raise UsageError(f"{key} {url}: bucket '{loc.bucket}' refused access ({code}); check the credentials") from None
    except BotoCoreError as e:
        raise UsageError(f"{key} {url}: cannot reach {endpoint} ({e}); check AWS_ENDPOINT_URL") from None
    _checked.add(loc.bucket)
    return loc


def is_precondition_failure(e: BaseException) -> bool:
    """A conditional write lost (412 PreconditionFailed, or 409 when two raced on real S3)."""
    resp = getattr(e, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = str(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code in PRECONDITION_CODES or status in ("412", "409")


def _not_found(e: BaseException) -> bool:
    resp = getattr(e, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404", "NotFound")


# ---------------------------------------------------------------------------------------------
# Whole objects
# ---------------------------------------------------------------------------------------------


def write_bytes(url: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
    """Store `data` as one object (one PutObject: readers see all of it or the previous object).

    if_none_match: only if no object exists (`If-None-Match: *`); if_match: only if the current
    object has this ETag. A lost condition raises botocore's ClientError (is_precondition_failure).
    Returns the new ETag.
    """
    loc = parse(url)
    kw: dict[str, Any] = {}
    if if_none_match:
        kw["IfNoneMatch"] = "*"
    if if_match is not None:
        kw["IfMatch"] = if_match
    return _client().put_object(Bucket=loc.bucket, Key=loc.key, Body=data, **kw)["ETag"]


def upload_file(url: str, path: Path) -> None:
    """A local file as one object (multipart above 8 MiB: still invisible until complete)."""
    loc = parse(url)
    _client().upload_file(str(path), loc.bucket, loc.key)


def read(url: str) -> tuple[bytes, str] | None:
    """(data, etag) of the object, or None when there is none."""
    from botocore.exceptions import ClientError

    loc = parse(url)
    try:
        r = _client().get_object(Bucket=loc.bucket, Key=loc.key)
    except ClientError as e:
        if _not_found(e):
            return None
        raise
    return r["Body"].read(), r["ETag"]


def read_bytes(url: str) -> bytes | None:
    got = read(url)
    return None if got is None else got[0]


def exists(url: str) -> bool:
    from botocore.exceptions import ClientError

    loc = parse(url)
    try:
        _client().head_object(Bucket=loc.bucket, Key=loc.key)
    except ClientError as e:
        if _not_found(e):
            return False
        raise
    return True


def delete(url: str, *, if_match: str | None = None) -> None:
    loc = parse(url)
    kw = {"IfMatch": if_match} if if_match is not None else {}
    _client().delete_object(Bucket=loc.bucket, Key=loc.key, **kw)


def list_objects(url: str) -> dict[str, dict[str, Any]]:
    """Every object under the prefix `url/`: {path relative to it: {"size", "mtime", "etag"}}."""
    loc = parse(url)
    prefix = loc.key + "/" if loc.key else ""
    out = {}
    for page in _client().get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) :]] = {
                "size": o["Size"],
                "mtime": o["LastModified"].timestamp(),
                "etag": o["ETag"],
            }
    return out


def download(url: str, path: Path, mtime: float | None = None) -> None:
    """One object to a local file (s3transfer writes a temporary file and renames it)."""
    loc = parse(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    _client().download_file(loc.bucket, loc.key, str(path))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def pull(url: str, local: Path, *, skip: tuple[str, ...] = ()) -> int:
    """Copy every object under `url/` (but prefixes in skip) into `local`; returns the count."""
    n = 0
    for rel, meta in sorted(list_objects(url).items()):
        if any(rel.startswith(s) or f"/{s}" in f"/{rel}" for s in skip):
            continue
        download(join(url, rel), local / rel, meta["mtime"])
        n += 1
    return n


def local_view(url: str, key: str = "store") -> Path:
    """A read-only local copy of a sweep (or store root) on object storage, for the store's readers.

    Checkpoints, Tune state and leases are left out. The copy lives in a temporary directory
    named like the sweep (load_runs reports the sweep by its directory name), removed at exit.
    """
    check(url, key)
    if not list_objects(url):
        raise UsageError(f"{key} {url}: nothing stored there; give a sweep (s3://BUCKET/PREFIX/SWEEP) or its root")
    top = Path(tempfile.mkdtemp(prefix="scalelab-view-"))
    atexit.register(shutil.rmtree, top, True)
    local = top / (name(url) or parse(url).bucket)
    local.mkdir()
    pull(url, local, skip=VIEW_SKIP)
    return local
