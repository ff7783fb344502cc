"""The wire format between a query process and its caller: frames on pipes.

A frame is its kind (1 byte), its length (8 bytes, big-endian) and its payload. The caller
writes ``Q`` (one request, JSON); the query process writes ``R`` (ready: its imports done),
``S`` (connected: the query's time counts from there), ``B`` (one record batch as an Arrow IPC
stream), then ``D`` (done: ``{"cut_by": ...}``) or ``E`` (an error: ``{"kind", "message"}``).
"""

from __future__ import annotations

import struct

#: A frame's head: its kind and its payload's length.
HEAD = struct.Struct(">cQ")


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame of ``kind`` carrying ``payload``."""
    return HEAD.pack(kind, len(payload)) + payload


def read_exact(stream, n: int) -> bytes | None:
    """``n`` bytes read from ``stream``; None if it ends first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
