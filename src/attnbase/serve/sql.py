"""SQL: ``POST /api/sql`` and the ``/sql`` console, over the ``attnbase sql`` sandbox.

The same checks (:func:`~attnbase.warehouse.sandbox.sql.check_user_sql`: one statement, an allowed type,
no name that shows the machine) and the same query processes
(:mod:`attnbase.warehouse.sandbox.sqlproc`) as the command; the server adds its limits
(:class:`~attnbase.serve.settings.Settings`): a time limit a request may only lower, a memory
limit, a row and byte cap for JSON (``truncated: true`` beyond them) and a byte cap for
CSV/Arrow/Parquet (``X-Attnbase-Truncated: true``), both counted in the bytes sent
(:mod:`attnbase.serve.answers`: a large answer is streamed, never held encoded). A query waits for one of ``sql_concurrency`` slots on the queries' own
threads, never on the event loop, so a runaway query does not hold up any other client.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from attnbase.serve.answers import WHOLE_BYTES
from attnbase.serve.web import catalog, in_session, page, status_for, without_server_paths

router = APIRouter()

FORMATS = ("json", "csv", "arrow", "parquet")
MEDIA = {"csv": "text/csv; charset=utf-8", "arrow": "application/vnd.apache.arrow.stream",
         "parquet": "application/vnd.apache.parquet"}

#: Example questions offered on the console (run_id filled from the first run).
EXAMPLES: tuple[tuple[str, str], ...] = (
    ("mean sink mass per layer",
     "select layer, avg(sink_mass) from row_stats where run_id = '{run}' group by 1 order by 1"),
    ("reversal study results",
     "select key, value from study_results join studies using (study_id) "
     "where kind = 'reversal'"),
    ("the Table-1 rows", "select * from table1"),
    ("heads with the largest sink mass",
     "select layer, head, mean_sink_mass, ve_gauss_z from head_summary where run_id = '{run}' "
     "order by mean_sink_mass desc limit 10"),
)


class SqlRequest(BaseModel):
    sql: str = Field(..., description="a SELECT / WITH / EXPLAIN query")
    format: Literal["json", "csv", "arrow", "parquet"] = "json"
    timeout_ms: int | None = Field(None, gt=0, description="lower the server's time limit")
    max_rows: int | None = Field(None, gt=0, description="lower the row cap (JSON) / cap rows")


def run_sql(cat, sql: str, fmt: str = "json", timeout_ms: int | None = None,
            max_rows: int | None = None):
    """The query's bounded result (:class:`~attnbase.warehouse.sandbox.sqlproc.UserResult`), run in a
    query process: the time limit (a request may only lower it), the memory limit, and the
    caps (rows and bytes for JSON, bytes for the other formats) hold whatever it does."""
    s = cat.settings
    cap = s.max_returned_rows if fmt == "json" else None
    rows = min(max_rows, cap) if (max_rows and cap) else (max_rows or cap)
    return cat.user_query(sql, timeout_s=(timeout_ms or s.sql_time_limit_ms) / 1000,
                          max_rows=rows,
                          max_bytes=s.max_json_bytes if fmt == "json" else s.max_stream_bytes)


#: Rows written to JSON at a time (the byte cap is checked between them).
JSON_ROWS = 256


def _exact_default(value):
    """orjson's ``default`` for a result's values: a DECIMAL (HUGEINT and UHUGEINT reach
    Python as ``Decimal`` too, through Arrow's decimal128) as a JSON number with every digit
    it holds, never rounded to a double; the rest as the service's other answers
    (:func:`attnbase.serve.web._json_default`)."""
    import orjson

    from attnbase.serve.web import _json_default

    if isinstance(value, Decimal):
        if value.is_finite():
            return orjson.Fragment(format(value, "f").encode())
        return None
    return _json_default(value)


def sql_json_chunks(result, max_bytes: int) -> Iterator[bytes]:
    """The result as JSON (``columns``, ``types``, ``rows`` as arrays, ``truncated``,
    ``elapsed_ms``) in chunks of :data:`JSON_ROWS` rows, cut (``truncated: true``) before it
    passes ``max_bytes``. Numbers are exact: integers of every width (BIGINT, UBIGINT,
    HUGEINT) and DECIMAL values are written with all their digits (a reader that takes JSON
    numbers as doubles, as JavaScript does, rounds integers past 2**53 itself)."""
    import orjson

    table = result.table
    opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    truncated = result.truncated
    head = orjson.dumps({"columns": table.column_names,
                         "types": [str(t) for t in table.schema.types]})[:-1] + b',"rows":['
    size = len(head) + 80  # the tail's room: "]," and truncated, elapsed_ms
    yield head
    sep = b""
    for start in range(0, table.num_rows, JSON_ROWS):
        part = table.slice(start, JSON_ROWS)
        rows = (list(zip(*(c.to_pylist() for c in part.columns))) if part.num_columns
                else [[] for _ in range(part.num_rows)])
        piece = orjson.dumps(rows, default=_exact_default, option=opts)[1:-1]
        if size + len(piece) + 1 > max_bytes:  # the rows of this part that fit, one by one
            fit = []
            for row in rows:
                one = orjson.dumps(row, default=_exact_default, option=opts)
                if size + len(one) + 1 > max_bytes:
                    break
                fit.append(one)
                size += len(one) + 1
            if fit:
                yield sep + b",".join(fit)
            truncated = True
            break
        if piece:
            yield sep + piece
            sep = b","
        size += len(piece) + 1
    yield b"]," + orjson.dumps({"truncated": truncated,
                                "elapsed_ms": round(result.elapsed_ms, 3)})[1:]


def sql_json_bytes(result, max_bytes: int) -> bytes:
    """:func:`sql_json_chunks` joined."""
    return b"".join(sql_json_chunks(result, max_bytes))


def sql_json(result, max_bytes: int) -> dict:
    """:func:`sql_json_bytes` as a dict (the console's page; the standard library's parser,
    which keeps integers past 64 bits exact where orjson's makes them floats)."""
    import json

    return json.loads(sql_json_bytes(result, max_bytes))


def _whole_or_stream(chunks: Iterator[bytes], media: str, headers: dict) -> Response | None:
    """The answer whole (with its length) when its chunks come to at most
    :data:`~attnbase.serve.answers.WHOLE_BYTES`; else ``None`` (``chunks`` closed)."""
    got, size = [], 0
    for chunk in chunks:
        got.append(chunk)
        size += len(chunk)
        if size > WHOLE_BYTES:
            chunks.close()
            return None
    return Response(b"".join(got), media_type=media, headers=headers)


def _respond(result, fmt: str, settings, download: bool = False) -> Response:
    """The answer under its byte cap (``max_json_bytes`` for JSON, ``max_stream_bytes`` for
    the others, counted in bytes sent): whole when small, else a :class:`Streamed` answer. A
    value the format cannot hold is a 400 naming its column (:func:`_not_encodable`)."""
    import pyarrow as pa

    try:
        return _answer(result, fmt, settings, download)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
        raise _not_encodable(result.table, fmt, err) from None


def _not_encodable(table, fmt: str, err: Exception):
    """One line naming the first column whose values ``fmt`` cannot hold (a BLOB or an
    infinite timestamp in JSON, an INTERVAL in CSV, a UNION in Parquet ...) and the fix."""
    from types import SimpleNamespace

    import pyarrow as pa

    from attnbase.errors import WarehouseError
    from attnbase.serve.answers import chunks

    for name, kind in zip(table.column_names, table.schema.types):
        one = table.select([name])
        try:
            if fmt == "json":
                for _ in sql_json_chunks(SimpleNamespace(table=one, truncated=False,
                                                         elapsed_ms=0.0), 1 << 62):
                    pass
            else:
                for _ in chunks(one, fmt, 1 << 62, {}):
                    pass
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as one_err:
            why = " ".join(str(one_err).split())[:160]
            return WarehouseError(
                f"column {name!r} ({kind}) cannot be written as {fmt.upper()} ({why}); cast it "
                f"in the query, e.g. CAST({name} AS VARCHAR), or ask for another format")
    why = " ".join(str(err).split())[:160]
    return WarehouseError(f"the answer cannot be written as {fmt.upper()} ({why}); cast its "
                          "columns in the query, e.g. CAST(x AS VARCHAR), or ask for another "
                          "format")


def _answer(result, fmt: str, settings, download: bool) -> Response:
    if fmt == "json":
        return (_whole_or_stream(sql_json_chunks(result, settings.max_json_bytes),
                                 "application/json", {})
                or Streamed(sql_json_chunks(result, settings.max_json_bytes),
                            media_type="application/json"))
    from attnbase.errors import QueryLimitError
    from attnbase.serve.answers import chunks, fitted

    cap, table = settings.max_stream_bytes, result.table
    headers = {"X-Attnbase-Elapsed-Ms": f"{result.elapsed_ms:.1f}"}
    if download:
        headers["Content-Disposition"] = f'attachment; filename="query.{fmt}"'
    cut: dict = {}
    whole = _whole_or_stream(chunks(table, fmt, cap, cut), MEDIA[fmt], headers)
    if whole is not None:
        kept = cut.get("rows")
    else:
        budget, kept = fitted(table, fmt, cap)
    if kept == 0 and table.num_rows:
        raise QueryLimitError(f"the answer's first row exceeds the byte cap of {cap} bytes "
                              f"of a {fmt.upper()} answer (the server's max_stream_bytes); "
                              "select fewer or shorter columns")
    truncated = str(result.truncated or kept is not None).lower()
    if whole is not None:
        whole.headers["X-Attnbase-Truncated"] = truncated
        return whole
    return Streamed(chunks(table, fmt, budget, {}), media_type=MEDIA[fmt],
                    headers={**headers, "X-Attnbase-Truncated": truncated})


class Streamed(StreamingResponse):
    """An answer sent chunk by chunk as the client takes them (each chunk encoded on a
    worker thread); :func:`in_query_pool` sets :attr:`release`, called when it has been sent
    or the client has gone, so the query's slot is held while its result is in memory."""

    release = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.release is not None:
                self.release()


async def in_query_pool(request: Request, route, *args):
    """``route(request, *args)`` in a catalog session on a worker thread of the queries' own
    pool (``sql_concurrency`` at once): the ad-hoc queries queue among themselves, never ahead
    of pages and patterns, each for at most ``sql_queue_wait_ms`` (then 503). A streamed
    answer holds its slot until it has been sent (or its client is gone): at most
    ``sql_concurrency`` results are in a server process's memory at once."""
    import functools

    import anyio
    import anyio.to_thread
    from starlette.exceptions import HTTPException

    state = request.app.state
    wait_s = state.settings.sql_queue_wait_ms / 1000
    acquired, slot = False, object()  # released by another task when an answer streams
    with anyio.move_on_after(wait_s):
        await state.query_limiter.acquire_on_behalf_of(slot)
        acquired = True
    if not acquired:
        raise HTTPException(503, f"the server's {state.settings.sql_concurrency} ad-hoc query "
                                 f"slots stayed busy for {wait_s:g} s (sql_queue_wait_ms); "
                                 "retry")
    try:
        answer = await anyio.to_thread.run_sync(
            functools.partial(in_session(route), request, *args), limiter=state.query_threads)
    except BaseException:
        state.query_limiter.release_on_behalf_of(slot)
        raise
    if isinstance(answer, Streamed):  # its result stays in memory until it has been sent
        answer.release = functools.partial(state.query_limiter.release_on_behalf_of, slot)
    else:
        state.query_limiter.release_on_behalf_of(slot)
    return answer


@router.post("/api/sql", tags=["sql"], summary="a read-only query (json, csv, arrow, parquet)")
async def api_sql(request: Request, body: SqlRequest):
    return await in_query_pool(request, _api_sql, body)


def _api_sql(request: Request, body: SqlRequest):
    result = run_sql(catalog(request), body.sql, body.format, body.timeout_ms, body.max_rows)
    return _respond(result, body.format, catalog(request).settings)


@router.get("/sql/download", include_in_schema=False)
async def sql_download(request: Request, sql: str, format: str = "csv"):
    from attnbase.serve.web import check_choice

    check_choice("format", format, ("csv", "parquet"))
    return await in_query_pool(request, _download, sql, format)


def _download(request: Request, sql: str, format: str):
    cat = catalog(request)
    return _respond(run_sql(cat, sql, format), format, cat.settings, download=True)


@router.get("/sql", include_in_schema=False)
async def sql_page(request: Request, sql: str = ""):
    return await in_query_pool(request, _sql_page, sql)


def _sql_page(request: Request, sql: str):
    from attnbase.errors import AttnbaseError

    cat = catalog(request)
    first = cat.rows("SELECT run_id FROM runs ORDER BY created_at, run_id LIMIT 1")
    run = first[0]["run_id"] if first else "RUN"
    examples = [(label, q.format(run=run.replace("'", "''"))) for label, q in EXAMPLES]
    result, error, code = None, None, 200
    if sql.strip():
        import pyarrow as pa

        try:
            answer = run_sql(cat, sql)
            try:
                result = sql_json(answer, cat.settings.max_json_bytes)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
                raise _not_encodable(answer.table, "json", err) from None
        except AttnbaseError as err:
            error, code = without_server_paths(request, " ".join(str(err).split("\n"))), \
                status_for(err)
    return page(request, "sql.html.j2", status_code=code, sql=sql, examples=examples,
                result=result, error=error, settings=cat.settings.described())
