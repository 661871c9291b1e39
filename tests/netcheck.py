"""Which TCP addresses processes listen on, read from /proc (Linux; no psutil needed).

    listening_sockets([pid, ...])   # {(ip, port, pid), ...} of LISTEN sockets those processes hold
    process_tree(pid)               # pid and all its descendants

Tests use it to check that a local job or sweep opens nothing beyond loopback.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")  # the last: IPv4 loopback on an IPv6 socket
_LISTEN = "0A"  # TCP state code in /proc/net/tcp


def _ip(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four 32-bit words, each in host (little-endian) byte order
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def _listening_inodes() -> dict[str, tuple[str, int]]:
    out = {}
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != _LISTEN:
                continue
            addr, port = cols[1].split(":")
            out[cols[9]] = (_ip(addr), int(port, 16))
    return out


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except (FileNotFoundError, PermissionError):
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening_sockets(pids) -> set[tuple[str, int, int]]:
    """(ip, port, pid) of every listening TCP socket held by the given processes."""
    table = _listening_inodes()
    found = set()
    for pid in pids:
        for inode in _socket_inodes(pid):
            if inode in table:
                found.add((*table[inode], pid))
    return found


def process_tree(pid: int) -> list[int]:
    """pid and every descendant that is alive now."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*") if Path(f"/proc/{p}/task").exists() else []:
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out
