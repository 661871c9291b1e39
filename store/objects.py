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

Keys are not trusted: anyone who can put an object under the prefix chooses its key. Every key a
listing returns must be a plain relative path below the prefix (no leading `/`, no empty, `.` or
`..` segment, `confined`); a listing that holds another is refused with one line naming the key,
before anything is downloaded, so no reader writes outside its view.
"""

from __future__ import annotations

import atexit
import email.utils
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError

SCHEMES = ("s3",)
# Prefixes a reader never needs (checkpoints are large; Tune state and leases are the writer's; offline
# W&B logs are for `wandb sync`).
VIEW_SKIP = ("checkpoints/", ".tune/", ".leases/", ".claims/", ".ray_train/", "wandb/")
LINKS = "links"  # <sweep>/links/<run_id>.json: the run lives in another sweep of the root (store.claims)
PRECONDITION_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
# The largest record a reader or a trial downloads (metrics.parquet of a run of millions of steps is
# tens of MB): a larger object under a sweep is not one of ours, and nobody should fetch it whole.
MAX_RECORD_BYTES = 256 << 20
NAME_MAX = 255  # bytes in one path segment: what local file systems store

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


def _client(fast: bool = False):
    """One boto3 S3 client per process, configured from the AWS environment.

    fast: the client of the lease and of fenced writes, whose requests must end well within a
    lease's life (one attempt, short timeouts) instead of retrying a stalled request for minutes."""
    name = "s3-fast" if fast else "s3"
    if name not in _clients:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UsageError("s3:// stores need boto3; pip install 'scalelab[s3]'") from None
        if fast:
            cfg = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=5)
        else:
            cfg = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60)
        session = boto3.session.Session()
        _clients["credentials"] = session.get_credentials()
        _clients[name] = session.client("s3", config=cfg)
    return _clients[name]


def confined(rel: str, where: str) -> str:
    """`rel` when it is a plain relative path (no leading `/`, no empty, `.` or `..` segment, no NUL or
    backslash): a key below a prefix, or a name read from a record that is used in a path.

    Raises:
        UsageError: one line naming `where` (the full key or the record) and the fix.
    """
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts) or "\\" in rel or "\x00" in rel:
        raise UsageError(
            f"{where}: {rel!r} is not a plain relative path (an absolute path, an empty, '.' or '..' segment); "
            "remove or rename that object"
        )
    if any(len(p.encode()) > NAME_MAX for p in parts):
        raise UsageError(f"{where}: a name longer than {NAME_MAX} bytes, which no local file can have; remove it")
    return rel


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


def check_sweep(url: str, key: str = "--out") -> Location:
    """check(), and a sweep's address has a prefix of its own: its parent is the store root, so
    `s3://BUCKET` alone would make the bucket's root a sweep of no root."""
    loc = parse(url, key)
    if not loc.key:
        raise UsageError(f"{key} {url}: a sweep needs a prefix below the bucket; write s3://{loc.bucket}/ROOT/SWEEP")
    return check(url, key)


def is_precondition_failure(e: BaseException) -> bool:
    """A conditional write lost (412 PreconditionFailed, or 409 when two raced on real S3)."""
    resp = getattr(e, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = str(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code in PRECONDITION_CODES or status in ("412", "409")


def is_not_found(e: BaseException) -> bool:
    """The object is not there (404 NoSuchKey; also what a write conditioned on its ETag gets)."""
    resp = getattr(e, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404", "NotFound")


# ---------------------------------------------------------------------------------------------
# Whole objects
# ---------------------------------------------------------------------------------------------


def _conditions(if_none_match: bool, if_match: str | None) -> dict[str, str]:
    kw = {}
    if if_none_match:
        kw["IfNoneMatch"] = "*"
    if if_match is not None:
        kw["IfMatch"] = if_match
    return kw


def write_bytes(
    url: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None, fast: bool = False
) -> str:
    """Store `data` as one object (one PutObject: readers see all of it or the previous object).

    if_none_match: only if no object exists (`If-None-Match: *`); if_match: only if the current
    object has this ETag. A lost condition raises botocore's ClientError (is_precondition_failure,
    or is_not_found when if_match names an object that is gone). Returns the new ETag.
    """
    loc = parse(url)
    kw = _conditions(if_none_match, if_match)
    return _client(fast).put_object(Bucket=loc.bucket, Key=loc.key, Body=data, **kw)["ETag"]


PART_BYTES = 64 << 20  # a file above this is uploaded in parts (S3 allows up to 10,000 of 5 MiB-5 GiB)


def put_file(url: str, path: Path, *, if_none_match: bool = False, if_match: str | None = None) -> str:
    """A local file as one object, under the same conditions as write_bytes; returns its ETag.

    Above PART_BYTES as a multipart upload, which is invisible until CompleteMultipartUpload; the
    condition is checked there, so a lost condition leaves the object as it was.
    """
    loc = parse(url)
    kw = _conditions(if_none_match, if_match)
    size = path.stat().st_size
    if size <= PART_BYTES:
        return write_bytes(url, path.read_bytes(), if_none_match=if_none_match, if_match=if_match)
    client = _client()
    upload = client.create_multipart_upload(Bucket=loc.bucket, Key=loc.key)["UploadId"]
    try:
        parts = []
        with open(path, "rb") as f:
            for number in range(1, -(-size // PART_BYTES) + 1):
                r = client.upload_part(
                    Bucket=loc.bucket, Key=loc.key, UploadId=upload, PartNumber=number, Body=f.read(PART_BYTES)
                )
                parts.append({"PartNumber": number, "ETag": r["ETag"]})
        done = client.complete_multipart_upload(
            Bucket=loc.bucket, Key=loc.key, UploadId=upload, MultipartUpload={"Parts": parts}, **kw
        )
        return done["ETag"]
    except BaseException:
        client.abort_multipart_upload(Bucket=loc.bucket, Key=loc.key, UploadId=upload)
        raise


@dataclass(frozen=True, slots=True)
class Stored:
    """An object as read: its bytes, its ETag, and its age on the store's own clock (None if unknown)."""

    data: bytes
    etag: str
    age_s: float | None


def read_object(url: str, *, fast: bool = False) -> Stored | None:
    """The object, or None when there is none. age_s is the store's clock at the answer (the HTTP
    Date header) minus the object's LastModified: both from the store, so no two machines' clocks
    are compared (1 s resolution)."""
    from botocore.exceptions import ClientError

    loc = parse(url)
    try:
        r = _client(fast).get_object(Bucket=loc.bucket, Key=loc.key)
    except ClientError as e:
        if is_not_found(e):
            return None
        raise
    if r.get("ContentLength", 0) > MAX_RECORD_BYTES:
        r["Body"].close()
        raise UsageError(f"{url}: {r['ContentLength']:,} bytes, larger than any record; remove or replace it")
    date = (r.get("ResponseMetadata") or {}).get("HTTPHeaders", {}).get("date")
    age = None
    if date and r.get("LastModified") is not None:
        age = (email.utils.parsedate_to_datetime(date) - r["LastModified"]).total_seconds()
    return Stored(r["Body"].read(), r["ETag"], age)


def read(url: str) -> tuple[bytes, str] | None:
    """(data, etag) of the object, or None when there is none."""
    got = read_object(url)
    return None if got is None else (got.data, got.etag)


def read_bytes(url: str) -> bytes | None:
    got = read(url)
    return None if got is None else got[0]


def head(url: str, *, fast: bool = False) -> str | None:
    """The object's ETag, or None when there is none."""
    from botocore.exceptions import ClientError

    loc = parse(url)
    try:
        return _client(fast).head_object(Bucket=loc.bucket, Key=loc.key)["ETag"]
    except ClientError as e:
        if is_not_found(e):
            return None
        raise


def exists(url: str) -> bool:
    return head(url) is not None


def delete(url: str, *, if_match: str | None = None, fast: bool = False) -> None:
    loc = parse(url)
    kw = {"IfMatch": if_match} if if_match is not None else {}
    _client(fast).delete_object(Bucket=loc.bucket, Key=loc.key, **kw)


def list_objects(url: str) -> dict[str, dict[str, Any]]:
    """Every object under the prefix `url/`: {path relative to it: {"size", "mtime", "etag"}}.

    Raises:
        UsageError: a key below the prefix is not a plain relative path (see `confined`).
    """
    loc = parse(url)
    prefix = loc.key + "/" if loc.key else ""
    out = {}
    for page in _client().get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            if o["Key"].endswith("/") and o["Size"] == 0:  # a "folder" a console made: no object of ours
                continue
            rel = confined(o["Key"][len(prefix) :], f"s3://{loc.bucket}/{o['Key']}")
            out[rel] = {
                "size": o["Size"],
                "mtime": o["LastModified"].timestamp(),
                "etag": o["ETag"],
            }
    for rel in out:  # a file and a folder of one name: no local copy can hold both
        parts = rel.split("/")
        if clash := next((f for k in range(1, len(parts)) if (f := "/".join(parts[:k])) in out), None):
            raise UsageError(f"s3://{loc.bucket}/{prefix}{clash}: an object and a folder of that name; remove one")
    return out


def too_large(url: str, size: int) -> bool:
    """Whether an object of `size` bytes is larger than any record (then: one warning, not fetched)."""
    if size <= MAX_RECORD_BYTES:
        return False
    print(f"warning: {url} ({size:,} bytes) is larger than any record; not downloaded", file=sys.stderr, flush=True)
    return True


def download(url: str, path: Path, mtime: float | None = None) -> None:
    """One object to a local file (s3transfer writes a temporary file and renames it)."""
    loc = parse(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    _client().download_file(loc.bucket, loc.key, str(path))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def pull(url: str, local: Path, *, skip: tuple[str, ...] = ()) -> int:
    """Copy every object under `url/` (but prefixes in skip) into `local`; returns the count.

    Every key is checked (list_objects) before the first download, so a listing that names a path
    outside `local` is refused whole."""
    n = 0
    for rel, meta in sorted(list_objects(url).items()):
        if any(rel.startswith(s) or f"/{s}" in f"/{rel}" for s in skip) or too_large(join(url, rel), meta["size"]):
            continue
        download(join(url, rel), inside(local, rel), meta["mtime"])
        n += 1
    return n


def inside(local: Path, rel: str) -> Path:
    """local / rel, checked to stay inside local (rel confined; symlinks resolved)."""
    dest = local / confined(rel, str(local / rel))
    if not dest.resolve().is_relative_to(local.resolve()):
        raise UsageError(f"{dest}: resolves outside {local}; remove the link that leads there")
    return dest


def local_view(url: str, key: str = "store") -> Path:
    """A read-only local copy of a sweep (or store root) on object storage, for the store's readers.

    Checkpoints, Tune state, claims and leases are left out. The copy lives in a temporary
    directory named like the sweep (load_runs reports the sweep by its directory name), removed at
    exit. A run another sweep of the root holds (links/<run_id>.json) appears under runs/<run_id>
    as in a local store: a symlink when that sweep is in the view, else a copy of its records.
    """
    check(url, key)
    if not list_objects(url):
        raise UsageError(f"{key} {url}: nothing stored there; give a sweep (s3://BUCKET/PREFIX/SWEEP) or its root")
    top = Path(tempfile.mkdtemp(prefix="scalelab-view-"))
    atexit.register(shutil.rmtree, top, True)
    local = top / (name(url) or parse(url).bucket)
    local.mkdir()
    pull(url, local, skip=VIEW_SKIP)
    for link in sorted(local.glob(f"*/{LINKS}/*.json")):  # a store root: sibling sweeps are in the view
        owner = linked_sweep(link.read_bytes(), str(link))
        here = link.parent.parent / "runs" / link.stem
        if not here.exists() and (local / owner / "runs" / link.stem).is_dir():
            here.parent.mkdir(exist_ok=True)
            os.symlink(os.path.join("..", "..", owner, "runs", link.stem), here)
    for link in sorted((local / LINKS).glob("*.json")):  # one sweep: the linked runs' records copied in
        owner = linked_sweep(link.read_bytes(), str(link))
        pull(join(parent(url), owner, "runs", confined(link.stem, str(link))), local / "runs" / link.stem,
             skip=VIEW_SKIP)  # fmt: skip
    return local


def linked_sweep(data: bytes, where: str) -> str:
    """The sweep a link object names (one plain path segment), or UsageError naming the object."""
    try:
        owner = json.loads(data)["sweep"]
    except (ValueError, KeyError, TypeError):
        owner = None
    if not isinstance(owner, str) or "/" in owner:
        raise UsageError(f"{where}: not a link to a sweep of this store root; remove it")
    return confined(owner, where)
