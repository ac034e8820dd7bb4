"""Loopback ports for the tests' servers that no other process is handed in the meantime.

A port probed with ``bind(("127.0.0.1", 0))`` and released is free only
until the kernel hands it to the next socket bound to port 0 or connecting
out: another test's server, a client's own end. Whether a server started a
second later still gets it then depends on what else the machine is doing.
The ports here are chosen below the kernel's ephemeral range, where it
never hands one out by itself, and never twice in one process;
:func:`held_port` keeps its port bound for a whole test, so that a server
can stop and come back on it.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator

_given: set[int] = set()
_held: list[socket.socket] = []
_random = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port that nothing is bound to, below the ephemeral range, not given before in this process."""
    high = _ephemeral_start()
    low = max(1024, high - 16_384)
    for _ in range(1000):
        port = _random.randrange(low, high)
        if port in _given:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}-{high - 1}")


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A port kept bound, but not listening, until the block ends.

    Connections to it are refused (a server that is down), and servers that
    bind with ``SO_REUSEPORT`` (``IngestServer(..., reuse_port=True)``)
    listen on it in turn, however long between them.
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def refused_port() -> int:
    """A port where nothing listens, for the rest of this process (it stays bound, so nothing else can)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _held.append(sock)
    return sock.getsockname()[1]
