"""Reports: figures (matplotlib SVG), Jinja2 HTML and WeasyPrint PDF over the catalog tables.

Reports read catalog tables only; they never compute statistics.

>>> from attnbase.reports import build_report        # doctest: +SKIP
>>> build_report("attnbase-db", "gpt2-small", compare=("pythia-160m",))  # doctest: +SKIP
ReportPaths(html=.../reports/gpt2-small/report.html, pdf=.../report.pdf)
"""

from __future__ import annotations

from attnbase.reports.blocks import SECTIONS, Section, register_section
from attnbase.reports.render import ReportPaths, build_report, render_html

__all__ = ["SECTIONS", "ReportPaths", "Section", "build_report", "register_section", "render_html"]
