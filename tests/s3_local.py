"""A local S3 endpoint for the object-storage tests: moto's server mode (a real HTTP S3 API) on loopback.

    with serve("bucket") as env:     # AWS_ENDPOINT_URL etc. set in os.environ for the block
        ...                          # env: the variables, for subprocesses

scalelab reaches it through the AWS environment as it would reach S3 or MinIO; the machine's own
AWS files are ignored.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

from moto import server as moto_server

from scalelab.store import objects

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
NO_FILES = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reset_client() -> None:
    """Forget the process's S3 clients (they hold the endpoint and credentials they were made with)."""
    objects._clients.clear()
    objects._checked.clear()


@contextlib.contextmanager
def serve(bucket: str) -> Iterator[dict[str, str]]:
    """A moto S3 server on 127.0.0.1 with one bucket, and the AWS environment pointing at it."""
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = dict(AWS_ENV, **NO_FILES, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    reset_client()
    objects._client().create_bucket(Bucket=bucket)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_client()
        server.stop()
