"""Tables that fit the printed page: a table wider than the page is split into several, each
repeating the key columns (the first ``Table.keys``), so no value runs off the page.

Widths are estimated from the text (DejaVu Sans at the print stylesheet's table font, ~7 pt:
about 5.8 CSS px per character, plus the cell's padding and border); value cells never wrap
(report.css), headers wrap between words and prose cells (> 32 characters) between words too.
tests/reports/test_report_fits.py checks the result in WeasyPrint's layout of reports of 6, 18
and 30 layers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnbase.reports.blocks import Block, Table

#: The A4 page's content width in CSS px (210 mm less 2 x 14 mm margins: 688 px), less 16.
PAGE_PX = 672.0
#: CSS px per character of table text in print, and per cell of padding and borders.
CHAR_PX, CELL_PX = 5.8, 11.0
#: Text longer than this wraps (td.prose in report.css); such a cell is at least this wide.
PROSE_CHARS = 32


def _chars(value: Any, header: bool) -> int:
    text = str(value)
    if header:  # a header wraps between words: its longest word is its least width
        return max((len(w) for w in text.split()), default=0)
    return PROSE_CHARS if len(text) > PROSE_CHARS else len(text)


def column_px(table: Table) -> list[float]:
    """The estimated least width of each column of ``table`` in CSS px."""
    widths = []
    for j, h in enumerate(table.headers):
        chars = max([_chars(h, True)] + [_chars(r[j], False) for r in table.rows if j < len(r)])
        widths.append(chars * CHAR_PX + CELL_PX)
    return widths


def split_table(table: Table, page_px: float = PAGE_PX) -> list[Table]:
    """``table`` as one or more tables no wider than ``page_px``, each with the key columns;
    the caption goes under the last part, each part is labelled with its columns."""
    widths = column_px(table)
    if sum(widths) <= page_px or len(widths) <= table.keys + 1:
        return [table]
    keys = list(range(table.keys))
    room = page_px - sum(widths[k] for k in keys)
    groups: list[list[int]] = [[]]
    used = 0.0
    for j in range(table.keys, len(widths)):
        if groups[-1] and used + widths[j] > room:
            groups.append([])
            used = 0.0
        groups[-1].append(j)
        used += widths[j]
    parts = []
    for i, cols in enumerate(groups):
        pick = keys + cols
        label = (f"Columns {table.headers[cols[0]]} to {table.headers[cols[-1]]} "
                 f"({i + 1} of {len(groups)})" if len(cols) > 1 else
                 f"Column {table.headers[cols[0]]} ({i + 1} of {len(groups)})")
        parts.append(replace(
            table, headers=[table.headers[j] for j in pick],
            rows=[[r[j] for j in pick] for r in table.rows],
            caption=table.caption if i == len(groups) - 1 else "", part=label))
    return parts


def fit_blocks(blocks: list[Block]) -> list[Block]:
    """``blocks`` with every table split to the page's width."""
    out: list[Block] = []
    for b in blocks:
        out.extend(split_table(b) if isinstance(b, Table) else [b])
    return out
