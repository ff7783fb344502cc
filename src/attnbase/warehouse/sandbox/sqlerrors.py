"""A failed user query as attnbase's error: a DuckDB error in one line, and what to do about
a query stopped at its memory limit. Shared by the in-process guard (:mod:`.sql`), the query
process (:mod:`.querychild`) and its caller (:mod:`.sqlproc`)."""

from __future__ import annotations

from attnbase.errors import ReadOnlyViolationError, WarehouseError

#: What to do about a query stopped at its memory limit: the settings that raise it.
MEMORY_HINT = ("narrow it (WHERE run_id = ..., fewer columns, LIMIT) or raise the limit "
               "(attnbase sql --memory-mb N; attnbase serve --setting sql_memory_mb=N)")


def sql_error(err) -> WarehouseError:
    """A DuckDB error as attnbase's: its first paragraph on one line; a permission error (a
    file outside the sandbox) as :class:`ReadOnlyViolationError`; a statistics file that
    cannot be read as :class:`~attnbase.errors.StatsFileCorruptError` naming it."""
    import duckdb

    # DuckDB's message and its hints ("Candidate bindings: ...", "Did you mean ...?") form the
    # first paragraph; the query echo with its caret ("LINE 1: ...") follows a blank line
    text = str(err).strip()
    line = "; ".join(ln.strip() for ln in text.split("\n\n")[0].splitlines() if ln.strip()) \
        if text else type(err).__name__
    from attnbase.warehouse.catalog.statledger import damaged_file_error

    damaged = damaged_file_error(err)
    if damaged is not None:  # a statistics file that cannot be read: name it and the fix
        return damaged
    if isinstance(err, duckdb.PermissionException):
        return ReadOnlyViolationError(
            f"attnbase sql reads only the catalog: {line} (file readers, glob, ATTACH and "
            "extension loads are disabled; query the catalog tables)")
    return WarehouseError(f"SQL error: {line}")
