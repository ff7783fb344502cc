"""A query's answer as the bytes sent, in chunks, never more than the byte cap.

``POST /api/sql`` and ``/sql/download`` send these. The cap counts the encoded bytes (JSON,
CSV, Arrow IPC stream, Parquet), not the Arrow data they are made of: a CSV of doubles is about
twice its Arrow bytes. An answer that fits in :data:`WHOLE_BYTES` is sent whole (with its
length); a larger one is streamed chunk by chunk, each chunk encoded as the client takes the
last, so a server process holds the result and about one chunk per answer, never the whole
encoded answer.

JSON says ``"truncated": true`` at its end. CSV, Arrow and Parquet say it in the
``X-Attnbase-Truncated`` header, before the first byte: a larger answer is encoded once without
being kept to find where the cap cuts it (:func:`fitted`), then again as it is sent.
"""

from __future__ import annotations

from collections.abc import Iterator

#: An answer up to this many bytes is encoded whole and sent with its Content-Length.
WHOLE_BYTES = 1 << 20
#: Arrow bytes of the rows encoded into one chunk of a CSV, Arrow or Parquet answer.
PART_BYTES = 1 << 20
#: Bytes a Parquet footer is allowed per column and row group while fitting rows under the cap.
FOOTER_PER_COLUMN = 256


class _Sink:
    """A file-like object pyarrow writes into; :meth:`take` hands the bytes on."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data) -> int:
        data = bytes(data)
        self.parts.append(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def _spans(table) -> Iterator[tuple[int, int]]:
    """``(start, rows)`` of the parts of ``table``, each about :data:`PART_BYTES` of Arrow data."""
    n = table.num_rows
    per = max(1, int(PART_BYTES * n / max(table.nbytes, 1))) if n else 1
    for start in range(0, n, per):
        yield start, min(per, n - start)


def _fit(encode, part, room: int) -> tuple[int, bytes]:
    """The most leading rows of ``part`` whose encoding (``encode(slice)``) fits in ``room``
    bytes, and that encoding (binary search over the row count)."""
    lo, hi, best = 0, part.num_rows, b""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        data = encode(part.slice(0, mid))
        if len(data) <= room:
            lo, best = mid, data
        else:
            hi = mid - 1
    return lo, best


def _plain(table):
    """``table`` with dictionary columns decoded (each chunk of an Arrow answer is encoded
    alone, so no chunk may depend on a dictionary sent with another)."""
    import pyarrow as pa

    if not any(pa.types.is_dictionary(t) for t in table.schema.types):
        return table
    schema = pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                        for f in table.schema])
    return table.cast(schema)


def _stateless(table, fmt: str, budget: int, cut: dict) -> Iterator[bytes]:
    """CSV or Arrow: a head, one encoding per part (each part alone), a tail."""
    import pyarrow as pa

    if fmt == "csv":
        import pyarrow.csv as pcsv

        def encode(part) -> bytes:
            sink = pa.BufferOutputStream()
            pcsv.write_csv(part, sink, pcsv.WriteOptions(include_header=False))
            return sink.getvalue().to_pybytes()

        sink = pa.BufferOutputStream()
        pcsv.write_csv(table.slice(0, 0), sink)
        head, tail = sink.getvalue().to_pybytes(), b""
    else:
        table = _plain(table)

        def encode(part) -> bytes:
            return b"".join(b.serialize().to_pybytes() for b in part.to_batches())

        sink = _Sink()
        with pa.ipc.new_stream(sink, table.schema):
            pass
        whole = sink.take()
        head, tail = whole[:-8], whole[-8:]  # the schema; the end-of-stream marker
    size = len(head) + len(tail)
    yield head
    for start, rows in _spans(table):
        data = encode(table.slice(start, rows))
        if size + len(data) > budget:
            kept, data = _fit(encode, table.slice(start, rows), budget - size)
            cut["rows"] = start + kept
            if data:
                yield data
            break
        size += len(data)
        yield data
    yield tail


def _parquet(table, budget: int, cut: dict) -> Iterator[bytes]:
    """Parquet: one row group per part, written while its Arrow bytes and a footer allowance
    fit under ``budget`` (the footer's size is known only at the end: :func:`fitted` lowers
    ``budget`` until the whole file fits the cap)."""
    import pyarrow.parquet as pq

    sink = _Sink()
    writer = pq.ParquetWriter(sink, table.schema)
    groups, cols = 0, max(table.num_columns, 1)
    try:
        for start, rows in _spans(table):
            part = table.slice(start, rows)
            room = budget - sink.size - 4096 - (groups + 1) * cols * FOOTER_PER_COLUMN
            if part.nbytes > room:
                rows = max(0, min(rows, int(rows * room / max(part.nbytes, 1))))
                cut["rows"] = start + rows
                if rows:
                    writer.write_table(part.slice(0, rows), row_group_size=rows)
                break
            writer.write_table(part, row_group_size=rows)
            groups += 1
            data = sink.take()
            if data:
                yield data
    finally:
        writer.close()
    yield sink.take()


def chunks(table, fmt: str, budget: int, cut: dict) -> Iterator[bytes]:
    """``table`` encoded as ``fmt`` (csv, arrow, parquet) in chunks, the rows that fit
    ``budget`` bytes (CSV and Arrow exactly; Parquet about); ``cut["rows"]`` is set to the
    rows kept when some were left out."""
    if fmt == "parquet":
        return _parquet(table, budget, cut)
    return _stateless(table, fmt, budget, cut)


def fitted(table, fmt: str, max_bytes: int) -> tuple[int, int | None]:
    """``(budget, rows kept or None)``: the budget for :func:`chunks` whose answer is at most
    ``max_bytes`` bytes, found by encoding without keeping the bytes (Parquet's footer may
    take a second try)."""
    budget = max_bytes
    for _ in range(8):
        cut: dict = {}
        total = sum(len(c) for c in chunks(table, fmt, budget, cut))
        if total <= max_bytes:
            return budget, cut.get("rows")
        budget -= total - max_bytes
    return 0, 0
