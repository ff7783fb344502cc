"""SQL: ``POST /api/sql`` and the ``/sql`` console, over the ``attnbase sql`` sandbox.

The same checks (:func:`~attnbase.warehouse.sandbox.sql.check_user_sql`: one statement, an allowed type,
no name that shows the machine) and the same query processes
(:mod:`attnbase.warehouse.sandbox.sqlproc`) as the command; the server adds its limits
(:class:`~attnbase.serve.settings.Settings`): a time limit a request may only lower, a memory
limit, a row and byte cap for JSON (``truncated: true`` beyond them) and a byte cap for
CSV/Arrow/Parquet. A query waits for one of ``sql_concurrency`` slots on the queries' own
threads, never on the event loop, so a runaway query does not hold up any other client.
"""

from __future__ import annotations

import io
from decimal import Decimal
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from attnbase.serve.web import in_session, catalog, page, status_for

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


def sql_json_bytes(result, max_bytes: int) -> bytes:
    """The result as JSON (``columns``, ``types``, ``rows`` as arrays, ``truncated``,
    ``elapsed_ms``), written :data:`JSON_ROWS` rows at a time and cut (``truncated: true``)
    before it passes ``max_bytes``. Numbers are exact: integers of every width (BIGINT,
    UBIGINT, HUGEINT) and DECIMAL values are written with all their digits (a reader that
    takes JSON numbers as doubles, as JavaScript does, rounds integers past 2**53 itself)."""
    import orjson

    table = result.table
    opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    pieces, size, truncated = [], 0, result.truncated
    for start in range(0, table.num_rows, JSON_ROWS):
        part = table.slice(start, JSON_ROWS)
        rows = (list(zip(*(c.to_pylist() for c in part.columns))) if part.num_columns
                else [[] for _ in range(part.num_rows)])
        piece = orjson.dumps(rows, default=_exact_default, option=opts)[1:-1]
        if size + len(piece) + 1 > max_bytes:  # the rows of this part that fit, one by one
            for row in rows:
                one = orjson.dumps(row, default=_exact_default, option=opts)
                if size + len(one) + 1 > max_bytes:
                    break
                pieces.append(one)
                size += len(one) + 1
            truncated = True
            break
        pieces.append(piece)
        size += len(piece) + 1
    head = orjson.dumps({"columns": table.column_names,
                         "types": [str(t) for t in table.schema.types]})[:-1]
    tail = orjson.dumps({"truncated": truncated, "elapsed_ms": round(result.elapsed_ms, 3)})[1:]
    return head + b',"rows":[' + b",".join(pieces) + b"]," + tail


def sql_json(result, max_bytes: int) -> dict:
    """:func:`sql_json_bytes` as a dict (the console's page; the standard library's parser,
    which keeps integers past 64 bits exact where orjson's makes them floats)."""
    import json

    return json.loads(sql_json_bytes(result, max_bytes))


def encode(table, fmt: str) -> bytes:
    import pyarrow as pa

    buf = io.BytesIO()
    if fmt == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, buf)
    elif fmt == "arrow":
        with pa.ipc.new_stream(buf, table.schema) as writer:
            writer.write_table(table)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, buf)
    return buf.getvalue()


def _respond(result, fmt: str, max_json: int, download: bool = False):
    if fmt == "json":
        return Response(sql_json_bytes(result, max_json), media_type="application/json")
    headers = {"X-Attnbase-Truncated": str(result.truncated).lower(),
               "X-Attnbase-Elapsed-Ms": f"{result.elapsed_ms:.1f}"}
    if download:
        headers["Content-Disposition"] = f'attachment; filename="query.{fmt}"'
    return Response(encode(result.table, fmt), media_type=MEDIA[fmt], headers=headers)


async def in_query_pool(request: Request, route, *args):
    """``route(request, *args)`` in a catalog session on a worker thread of the queries' own
    pool (``sql_concurrency`` at once): the ad-hoc queries queue among themselves, never ahead
    of pages and patterns, each for at most ``sql_queue_wait_ms`` (then 503)."""
    import functools

    import anyio
    import anyio.to_thread
    from starlette.exceptions import HTTPException

    state = request.app.state
    wait_s = state.settings.sql_queue_wait_ms / 1000
    acquired = False
    with anyio.move_on_after(wait_s):
        await state.query_limiter.acquire()
        acquired = True
    if not acquired:
        raise HTTPException(503, f"the server's {state.settings.sql_concurrency} ad-hoc query "
                                 f"slots stayed busy for {wait_s:g} s (sql_queue_wait_ms); "
                                 "retry")
    try:
        return await anyio.to_thread.run_sync(
            functools.partial(in_session(route), request, *args), limiter=state.query_threads)
    finally:
        state.query_limiter.release()


@router.post("/api/sql", tags=["sql"], summary="a read-only query (json, csv, arrow, parquet)")
async def api_sql(request: Request, body: SqlRequest):
    return await in_query_pool(request, _api_sql, body)


def _api_sql(request: Request, body: SqlRequest):
    result = run_sql(catalog(request), body.sql, body.format, body.timeout_ms, body.max_rows)
    return _respond(result, body.format, catalog(request).settings.max_json_bytes)


@router.get("/sql/download", include_in_schema=False)
async def sql_download(request: Request, sql: str, format: str = "csv"):
    from attnbase.serve.web import check_choice

    check_choice("format", format, ("csv", "parquet"))
    return await in_query_pool(request, _download, sql, format)


def _download(request: Request, sql: str, format: str):
    cat = catalog(request)
    return _respond(run_sql(cat, sql, format), format, cat.settings.max_json_bytes,
                    download=True)


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
        try:
            result = sql_json(run_sql(cat, sql), cat.settings.max_json_bytes)
        except AttnbaseError as err:
            error, code = " ".join(str(err).split("\n")), status_for(err)
    return page(request, "sql.html.j2", status_code=code, sql=sql, examples=examples,
                result=result, error=error, settings=cat.settings.described())
