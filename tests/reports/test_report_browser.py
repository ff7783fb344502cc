"""Headless-chromium screenshot of a report (``make test-browser``; deselected by default).

``make test-browser`` builds a small report, screenshots it into docs/report-screenshot.png and
points ``ATTNBASE_SCREENSHOT`` at it; run alone, this test builds and screenshots on its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.browser

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


def screenshot(html: Path, png: Path, size: str = "1280,4000") -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed: run `make test-browser` (it installs Debian's chromium)"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                        f"--screenshot={png}", f"--window-size={size}", html.resolve().as_uri()],
                       check=True, capture_output=True, timeout=180)


@pytest.fixture(scope="module")
def png(tmp_path_factory, catalog) -> Path:
    given = os.environ.get("ATTNBASE_SCREENSHOT")
    if given:
        return Path(given)
    from attnbase.reports import build_report

    out = tmp_path_factory.mktemp("browser")
    paths = build_report(catalog, "gpt2-a", compare=("neox-b",), out_dir=out)
    shot = out / "report.png"
    screenshot(paths.html, shot)
    return shot


def test_screenshot_exists_and_is_not_blank(png):
    from PIL import Image

    assert png.is_file() and png.stat().st_size > 20_000
    img = np.asarray(Image.open(png).convert("L"), dtype=float)
    assert img.shape[1] == 1280
    ink = (img < 200).mean()  # share of non-background pixels: text, axes, heatmaps
    assert 0.02 < ink < 0.6, ink
    rows_with_ink = (img < 200).any(axis=1).mean()  # the page is filled top to bottom
    assert rows_with_ink > 0.5, rows_with_ink
    assert len(np.unique(img)) > 50  # anti-aliased text and colour maps, not a flat page
