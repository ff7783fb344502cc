"""The statistics files' schemas and the SQL of their views: the bottom piece that the run
handle, the file ledger (:mod:`attnbase.warehouse.catalog.statledger`) and the files' reader and writer
(:mod:`attnbase.warehouse.runs.statfiles`) share."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pyarrow as pa

from attnbase.contract import COL_KEY_COLUMNS, COL_STAT_COLUMNS, ROW_KEY_COLUMNS, ROW_STAT_COLUMNS
from attnbase.errors import WarehouseError

#: Arrow types of the stored columns; the views cast nothing, so these are the SQL types too.
ROW_SCHEMA = pa.schema(
    [("layer", pa.int16()), ("head", pa.int16()), ("seq", pa.int32()), ("query", pa.int32()),
     ("n_keys", pa.int32()), ("sink_mass", pa.float64()), ("max_prob", pa.float64()),
     ("argmax", pa.int32()), ("entropy", pa.float64()), ("sink_balance", pa.float64()),
     ("content_entropy", pa.float64()), ("content_dispersion", pa.float64())]
)
COL_SCHEMA = pa.schema(
    [("layer", pa.int16()), ("head", pa.int16()), ("seq", pa.int32()), ("key", pa.int32()),
     ("received", pa.float64())]
)
SCHEMAS = {"row_stats": ROW_SCHEMA, "col_stats": COL_SCHEMA}
assert tuple(ROW_SCHEMA.names) == ROW_KEY_COLUMNS + ROW_STAT_COLUMNS
assert tuple(COL_SCHEMA.names) == COL_KEY_COLUMNS + COL_STAT_COLUMNS

#: lz4: DuckDB decodes it faster than zstd, so the catalog's questions answer sooner and the
#: files are written faster, for slightly larger files (benchmarks/RESULTS.md: "lz4 statistics
#: files, catalog questions" and "statistics files in lz4").
COMPRESSION = "lz4"
SCHEMA_FILE = "_schema.parquet"


def view_sql(table: str, sources: Sequence[str] | None = None, temp: bool = False,
             missing: dict[str, str] | None = None) -> str:
    """``CREATE OR REPLACE VIEW <table>`` over the Parquet files ``sources`` (relative paths,
    see the module doc, or URLs; :func:`attnbase.warehouse.catalog.statledger.refresh_views` lists
    them); None: every file of the table's directory (the glob of migration 3, replaced by the
    list in migration 20). ``temp``: a view of this connection only. ``missing``: run id ->
    one-line message, for runs with a listed file that is gone; a question that does not rule
    such a run out by its ``run_id`` fails with the message (one row per run whose every
    column raises it), one that does is answered from the other runs' files."""
    names = ["run_id", *SCHEMAS[table].names]
    cols = ", ".join(names)
    sources = [f"{table}/run_id=*/*.parquet"] if sources is None else list(sources)
    source = (f"'{sql_str(sources[0])}'" if len(sources) == 1
              else "[" + ", ".join(f"'{sql_str(g)}'" for g in sources) + "]")
    sql = (f"CREATE OR REPLACE {'TEMP ' if temp else ''}VIEW {table} AS SELECT {cols} FROM "
           f"read_parquet({source}, hive_partitioning = true, "
           "hive_types = {'run_id': VARCHAR}, union_by_name = false)")
    types = {f.name: duck_type(f.type) for f in SCHEMAS[table]}
    for run_id, message in sorted((missing or {}).items()):
        fail = f"error('{sql_str(message)}')"
        sql += (f" UNION ALL SELECT '{sql_str(run_id)}' AS run_id, "
                + ", ".join(f"{fail}::{types[c]} AS {c}" for c in names[1:])
                + f" FROM range(1) WHERE {fail} IS NULL")
    return sql


def catalog_dir(con) -> Path:
    """The directory relative statistics paths resolve against: the connection's
    ``file_search_path`` where set (every catalog connection sets it), else the directory of
    the catalog file it is attached to."""
    search = con.execute("SELECT current_setting('file_search_path')").fetchall()[0][0]
    if search:
        return Path(search).resolve()
    row = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                      ).fetchone()
    if row is None or not row[0]:
        raise WarehouseError("the catalog connection is not attached to a file; cannot place "
                             "row_stats/col_stats files")
    return Path(row[0]).resolve().parent


def duck_type(t: pa.DataType) -> str:
    return {pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.float64(): "DOUBLE"}[t]


def sql_str(s: str) -> str:
    return s.replace("'", "''")
