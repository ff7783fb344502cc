"""Console output of the listing commands (``runs``, ``table1``, ``sql``): one place for the
formats and for what "scriptable" means.

- ``--format table`` (default): a rich table; on a terminal it fits the terminal, piped it is
  printed at full width (no ``minilm…`` truncation, nothing wrapped), so ``| grep`` sees values.
- ``--format csv``: every value in full; nested values (lists, structs) as JSON text, so any
  query result can be written (polars alone refuses nested columns in CSV).
- ``--format json``: one JSON array of row objects.
"""

from __future__ import annotations

import json
import sys

from attnbase.errors import AttnbaseError

FORMATS = ("table", "csv", "json")
#: Width of a piped table: wide enough that rich never truncates or wraps a cell.
PIPED_WIDTH = 4096


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise AttnbaseError(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
    return fmt


def console(**kwargs):
    """A rich console on stdout: terminal width on a terminal, :data:`PIPED_WIDTH` when piped."""
    from rich.console import Console

    if not sys.stdout.isatty():
        kwargs.setdefault("width", PIPED_WIDTH)
    return Console(**kwargs)


def flat_for_csv(df):
    """``df`` with every nested column (list, array, struct) as JSON text."""
    import polars as pl

    nested = [c for c, t in df.schema.items() if t.is_nested()]
    if not nested:
        return df
    return df.with_columns(
        pl.Series(c, [None if v is None else json.dumps(v, default=str) for v in df[c].to_list()],
                  dtype=pl.String) for c in nested)


def write_frame(df, fmt: str) -> None:
    """Write a polars DataFrame as csv or json on stdout (a result is never a traceback)."""
    try:
        if fmt == "csv":
            sys.stdout.write(flat_for_csv(df).write_csv())
        elif fmt == "json":
            sys.stdout.write(df.write_json() + "\n")
        else:
            raise AttnbaseError(f"write_frame writes csv or json, not {fmt!r}")
    except AttnbaseError:
        raise
    except Exception as err:  # noqa: BLE001 - a value no writer takes: one line, not a traceback
        raise AttnbaseError(f"could not write the result as {fmt}: {type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''}; try another "
                            "--format or cast the column in SQL") from None
