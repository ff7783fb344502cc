"""Rows into catalog tables from Arrow data, on an open connection or transaction."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa


def to_arrow(columns: Any) -> pa.Table:
    """A polars/pandas DataFrame, pyarrow Table or mapping of 1-D arrays as a pyarrow Table."""
    if isinstance(columns, pa.Table):
        return columns
    if hasattr(columns, "to_arrow"):  # polars
        return columns.to_arrow()
    if isinstance(columns, dict):
        return pa.table({k: np.asarray(v) for k, v in columns.items()})
    return pa.Table.from_pandas(columns, preserve_index=False)



def insert_table(con, table: str, tbl: pa.Table) -> None:
    """On an open connection/transaction: insert an Arrow table's rows into ``table`` by column
    name (no-op for an empty table)."""
    if tbl.num_rows == 0:
        return
    con.register("_attnbase_rows", tbl)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _attnbase_rows")
    finally:
        con.unregister("_attnbase_rows")


def insert_rows(con, table: str, run_id: str, tbl: pa.Table, *, where: str | None = None,
                params: Sequence[Any] = (), delete: bool = True) -> None:
    """On an open connection/transaction: optionally delete ``run_id``'s rows, then insert."""
    if delete:
        clause = f" AND ({where})" if where else ""
        con.execute(f"DELETE FROM {table} WHERE run_id = ?{clause}", [run_id, *params])
    if "run_id" in tbl.column_names:
        insert_table(con, table, tbl)
        return
    if tbl.num_rows == 0:
        return
    con.register("_attnbase_rows", tbl)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT ?::VARCHAR AS run_id, * "
                    "FROM _attnbase_rows", [run_id])
    finally:
        con.unregister("_attnbase_rows")

