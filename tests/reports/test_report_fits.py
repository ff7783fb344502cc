"""Every table cell of the PDF report is on its page: reports of runs of 6, 18 and 30 layers
are rendered; no cell of WeasyPrint's layout reaches past its page's content box, and each
cell's text is found in the text pypdf extracts from the PDF."""

from __future__ import annotations

import html as htmllib
import re

import pytest
from report_fixtures import make_depth_catalog

LAYERS = (6, 18, 30)


@pytest.fixture(scope="module")
def depth_catalog(tmp_path_factory):
    return make_depth_catalog(tmp_path_factory.mktemp("depth") / "db", LAYERS)


def _cells(html: str) -> list[str]:
    out = []
    for table in re.findall(r"<table.*?</table>", html, flags=re.S):
        for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", table, flags=re.S):
            text = htmllib.unescape(re.sub(r"<[^>]+>", "", cell))
            if text.strip():
                out.append(text)
    return out


def _page_text(pdf_path) -> str:
    """The text of every page whose drawing starts inside the page's width, spaces removed."""
    from pypdf import PdfReader

    parts = []
    for page in PdfReader(str(pdf_path)).pages:
        width = float(page.mediabox.width)

        def visit(text, cm, tm, font, size, parts=parts, width=width):
            x = cm[0] * tm[4] + cm[2] * tm[5] + cm[4]
            if text and -1 <= x <= width - 1:
                parts.append(text)

        page.extract_text(visitor_text=visit)
    return re.sub(r"\s+", "", "".join(parts))


def _overflowing_cells(html: str, base_url) -> list[tuple[int, str]]:
    """``(page, text)`` of every table cell WeasyPrint lays out past its page's content box."""
    import logging

    import weasyprint
    from weasyprint.formatting_structure import boxes

    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    out = []
    for i, page in enumerate(weasyprint.HTML(string=html, base_url=str(base_url)).render().pages):
        box = page._page_box
        right = box.content_box_x() + box.width
        for b in box.descendants():
            if isinstance(b, boxes.TableCellBox) and b.border_box_x() + b.border_width() > right + 0.5:
                words = [t.text for t in b.descendants() if isinstance(t, boxes.TextBox)]
                out.append((i + 1, " ".join(words)))
    return out


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.slow
@pytest.mark.parametrize("n_layers", LAYERS)
def test_every_table_cell_is_on_its_page(depth_catalog, tmp_path, n_layers):
    from attnbase.reports import build_report

    paths = build_report(depth_catalog, f"deep-{n_layers}", out_dir=tmp_path)
    html = paths.html.read_text()
    cells = _cells(html)
    assert len(cells) > 50
    if n_layers >= 18:  # the rank-collapse values of the deepest hidden state are there
        assert any(f"H{n_layers}" in c for c in cells)
    over = _overflowing_cells(html, tmp_path)
    assert not over, f"{len(over)} cells past the page's edge, e.g. {over[:6]}"
    text = _page_text(paths.pdf)
    lost = [c for c in cells if _squash(c) not in text]
    assert not lost, f"{len(lost)} of {len(cells)} cells not in the PDF's text, e.g. {lost[:8]}"


def test_split_table_keeps_keys_and_every_column_once():
    from attnbase.reports.blocks import Table
    from attnbase.reports.fit import PAGE_PX, column_px, split_table

    headers = ["Variant", "Init"] + [f"H{i}" for i in range(31)]
    rows = [["full", "pretrained"] + [f"0.{i:03d} ± 0.01" for i in range(31)]]
    table = Table(headers, rows, caption="the values", keys=2)
    parts = split_table(table)
    assert len(parts) > 1
    assert all(sum(column_px(p)) <= PAGE_PX for p in parts)
    assert all(p.headers[:2] == ["Variant", "Init"] and p.rows[0][:2] == ["full", "pretrained"]
               for p in parts)
    assert [h for p in parts for h in p.headers[2:]] == headers[2:]  # each once, in order
    assert [c for p in parts for c in p.rows[0][2:]] == rows[0][2:]
    assert [bool(p.caption) for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[0].part.startswith("Columns H0 to ") and parts[-1].part.endswith(
        f"({len(parts)} of {len(parts)})")
    narrow = Table(["a", "b"], [["x", "y"]])
    assert split_table(narrow) == [narrow]  # a table that fits is left alone
