"""``attnbase sql``'s table never prints a p- or q-value as "0" (docs/metrics.md §8)."""

from __future__ import annotations


def test_sql_table_writes_p_columns_as_bounds(capsys):
    import polars as pl

    from attnbase.commands.sql import _print_table

    _print_table(pl.DataFrame({"layer": [0], "p_value": [0.0], "q_value": [0.0],
                               "value": [0.0]}))
    out = capsys.readouterr().out
    assert out.count("< 1e-300") == 2
    row = [line for line in out.splitlines() if "1e-300" in line][0]
    assert [c.strip() for c in row.strip("│ ").split("│")] == ["0", "< 1e-300", "< 1e-300", "0"]
