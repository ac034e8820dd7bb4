"""Ingest bodies to rows: inflated within a limit, decoded and checked off the event loop.

On decoding processes (:func:`prepare`, pickled batches back) for
``otel-rl serve``; on decoding threads of the server's process for an embedded
server (:func:`decoded_rows`), where a large body is decoded chunk by chunk.
"""

from __future__ import annotations

import os
import pickle
import select
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from otel_rl.readers.server.storage import Row
from otel_rl.readers.server.validation import LARGE_BODY_BYTES, Decoded, decode_batch, iter_large_batch, stored_text

CHUNK_RECORDS = 2000
"""Records stored per transaction: ``/healthz`` and other requests are served between two."""

OffLoop = Callable[..., Awaitable[Any]]
"""``off_loop(executor, fn, *args)``: ``fn(*args)`` on ``executor``, awaited on the event loop."""


def exit_with(server_pid: int) -> None:
    """Initializer of a decoding process: exit as soon as the server that started it is gone.

    A server killed outright (SIGKILL, the OOM killer) cannot stop its pool;
    its decoding processes would wait on their queues forever, and keep the
    forkserver that made them alive with them.
    """

    def watch() -> None:
        try:
            server = os.pidfd_open(server_pid)  # readable when the process ends: no polling
            select.select([server], [], [])
        except (AttributeError, OSError):  # no pidfd here: look every second
            while _alive(server_pid):
                time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="otel-rl-server-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def decompress(body: bytes, limit: int) -> bytes:
    """Inflate a gzip body (every member, as gzip allows), refusing to produce more than ``limit`` bytes.

    Raises:
        OverflowError: the inflated body would pass ``limit``.
        zlib.error: not valid gzip.
    """
    out = bytearray()
    data = body
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += inflater.decompress(data, limit - len(out) + 1)
        if inflater.unconsumed_tail or len(out) > limit:
            raise OverflowError
        out += inflater.flush()
        if len(out) > limit:
            raise OverflowError
        if not inflater.eof:
            raise zlib.error("truncated gzip stream")
        data = inflater.unused_data
        if data and not data.strip(b"\0"):
            break  # zero padding after the last member
    return bytes(out)


def rows_of(decoded: Decoded) -> list[Row]:
    return [Row.of(record, stored_text(record)) for _, record in decoded.records]


def refusals(rejected: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    """The ``rejected`` entries of an answer."""
    return [{"index": i, "field": f, "error": e} for i, f, e in rejected]


def prepare(body: bytes, gzipped: bool, limit: int) -> tuple[list[bytes], list[tuple[int, str, str]]]:
    """Inflate, decode and check a whole body (in a decoding process): pickled batches of rows, and refusals.

    Rows come back pickled per batch of :data:`CHUNK_RECORDS`, so the server
    unpickles one batch at a time instead of holding its GIL for a whole
    100,000-record body.

    Raises:
        OverflowError, zlib.error: see :func:`decompress`.
        Invalid: the body is not a batch.
    """
    if gzipped:
        body = decompress(body, limit)
    chunks = [decode_batch(body)] if len(body) <= LARGE_BODY_BYTES else iter_large_batch(body, CHUNK_RECORDS)
    batches: list[bytes] = []
    rejected: list[tuple[int, str, str]] = []
    for chunk in chunks:
        rows = rows_of(chunk)
        for start in range(0, len(rows), CHUNK_RECORDS):
            batches.append(pickle.dumps(rows[start : start + CHUNK_RECORDS], pickle.HIGHEST_PROTOCOL))
        rejected += chunk.rejected
    return batches, rejected


async def decoded_rows(body: bytes, executor: Executor, off_loop: OffLoop, rejected: list[dict[str, Any]]) -> AsyncIterator[list[Row]]:
    """Rows of a body decoded on ``executor`` threads: a large body chunk by chunk, so the loop is never held long.

    Refused records are appended to ``rejected`` as they are found.
    """
    if len(body) <= LARGE_BODY_BYTES:
        chunks: Any = iter([await off_loop(executor, decode_batch, body)])
    else:
        chunks = iter_large_batch(body, CHUNK_RECORDS)
    done = object()
    while True:
        decoded = await off_loop(executor, next, chunks, done)
        if decoded is done:
            return
        rejected += refusals(decoded.rejected)
        yield await off_loop(executor, rows_of, decoded)


async def unpickled(pickled: list[bytes], executor: Executor, off_loop: OffLoop) -> AsyncIterator[list[Row]]:
    """The batches :func:`prepare` pickled, unpickled one at a time on ``executor``."""
    for data in pickled:
        yield await off_loop(executor, pickle.loads, data)
