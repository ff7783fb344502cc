"""HTML -> PDF with WeasyPrint (imported lazily: it loads the system pango)."""

from __future__ import annotations

import logging
from pathlib import Path


def html_to_pdf(html: str, base_url: Path | str | None = None) -> bytes:
    """Render ``html`` to PDF bytes; text stays text (extractable)."""
    import weasyprint

    # WeasyPrint logs every CSS property it ignores at WARNING; keep reports quiet.
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    return weasyprint.HTML(string=html, base_url=str(base_url) if base_url else None).write_pdf()
