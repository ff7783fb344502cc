"""Headless Chromium on a real server: a run page (head finder) and a head page (pattern with
token labels), screenshotted into docs/serve-run.png and docs/serve-head.png (``make
test-browser``; deselected by default).

The DOM (``--dump-dom``, after the page's script ran) must hold the grid's cells and the
pattern's labels; the screenshots must not be blank. ``ATTNBASE_SERVE_DB`` names another database
to screenshot (the README's pictures come from a MiniLM run) with ``ATTNBASE_SERVE_RUN`` and
``ATTNBASE_SERVE_HEAD`` (``layer/head``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from serve_fixtures import RUN, Server

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium(*args: str) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed: run `make test-browser` (it installs Debian's chromium)"
    with tempfile.TemporaryDirectory() as profile:
        p = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args],
                           capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-500:]
    return p.stdout


@pytest.fixture
def shots(tmp_path) -> Path:
    """Where the screenshots go: docs/ when ``ATTNBASE_SERVE_DB`` names the database the README's
    pictures come from (a MiniLM run), else a temporary folder (the tiny fixture's pages must
    not replace them)."""
    return DOCS if os.environ.get("ATTNBASE_SERVE_DB") else tmp_path


@pytest.fixture(scope="module")
def target(serve_db):
    db = Path(os.environ.get("ATTNBASE_SERVE_DB", serve_db))
    run = os.environ.get("ATTNBASE_SERVE_RUN", RUN)
    srv = Server(db)
    yield srv, run
    srv.stop()


def _not_blank(png: Path) -> None:
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(float)
    assert img.shape[0] > 500 and img.shape[1] > 800
    assert img.std() > 20, "screenshot is (nearly) one colour"
    assert len(np.unique(img.reshape(-1, 3)[::7], axis=0)) > 50  # figures, grid, text


def test_run_page_head_finder(target, shots):
    srv, run = target
    url = f"{srv.url}/runs/{run}"
    dom = chromium("--dump-dom", url)
    grid = dom[dom.index('id="head-grid"'):dom.index("</table>", dom.index('id="head-grid"'))]
    assert grid.count('class="cell"') >= 16 and grid.count(f'href="/runs/{run}/heads/') >= 16
    png = shots / "serve-run.png"
    chromium(f"--screenshot={png}", "--window-size=1280,1500", url)
    _not_blank(png)


def test_head_page_pattern_with_labels(target, shots):
    srv, run = target
    head = os.environ.get("ATTNBASE_SERVE_HEAD", "2/1")  # layer/head
    url = f"{srv.url}/runs/{run}/heads/{head}?seq=1"
    dom = chromium("--dump-dom", url)
    pattern = dom[dom.index('id="pattern"'):dom.index("</table>", dom.index('id="pattern"'))]
    labels = pattern.count('class="klabel"')
    assert labels >= 16 and pattern.count('class="qlabel"') == labels
    assert pattern.count("data-v=") == labels * labels
    assert 'id="toggle-drop_sink"' in dom and 'id="metrics"' in dom
    png = shots / "serve-head.png"
    chromium(f"--screenshot={png}", "--window-size=1280,1700", url)
    _not_blank(png)


def test_pattern_readout_names_query_and_key(target, tmp_path):
    """The value under the cursor: the served script, on the served pattern table, in Chromium
    (a mouseover dispatched on query 2's key-1 cell; the cells carry no titles)."""
    import re

    import httpx

    srv, run = target
    head = os.environ.get("ATTNBASE_SERVE_HEAD", "2/1")
    html = httpx.get(f"{srv.url}/runs/{run}/heads/{head}?seq=1", timeout=30).text
    table = html[html.index('<table class="pattern"'):html.index("</table>", html.index(
        '<table class="pattern"')) + len("</table>")]
    assert " title=" not in table
    script = httpx.get(f"{srv.url}/static/app.js", timeout=30).text
    page = tmp_path / "readout.html"
    page.write_text(
        f'<!doctype html><meta charset="utf-8"><main><span class="readout">-</span>{table}</main>'
        f"<script>{script}</script><script>var td = document.querySelectorAll('#pattern tr')[3]"
        ".querySelectorAll('td')[1]; td.dispatchEvent(new MouseEvent('mouseover', "
        "{bubbles: true}));</script>", encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri())
    from html import unescape

    readout = unescape(re.search(r'<span class="readout">(.*?)</span>', dom).group(1))
    rows = [unescape(t) for t in re.findall(r'<th class="qlabel">(.*?)</th>', table)]
    keys = [unescape(t) for t in re.findall(r'<th class="klabel"><span>(.*?)</span></th>', table)]
    cell = re.findall(r'data-v="([^"]*)"', table.split("<tr>")[4])[1]  # [1] is the header
    assert readout == f"q2 {rows[2]} \u2192 k1 {keys[1]}: {cell}", readout
