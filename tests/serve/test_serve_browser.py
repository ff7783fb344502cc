"""Headless Chromium on a real server: a run page (head finder) and a head page (pattern with
token labels), screenshotted into docs/serve-run.png and docs/serve-head.png (``make
test-browser``; deselected by default).

The DOM (``--dump-dom``, after the page's script ran) must hold the grid's cells and the
pattern's labels; the screenshots must not be blank. ``ATTNBASE_SERVE_DB`` names another database
to screenshot (the README's pictures come from a MiniLM run) with ``ATTNBASE_SERVE_RUN`` and
``ATTNBASE_SERVE_HEAD`` (``layer/head``).
"""

from __future__ import annotations

import html
import json
import os
import re
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
    probs = json.loads(html.unescape(re.search(r'data-probs="([^"]*)"', pattern).group(1)))
    assert len(probs) == labels and {len(row) for row in probs} == {labels}
    assert pattern.count("<td ") == labels * labels
    assert 'id="toggle-drop_sink"' in dom and 'id="metrics"' in dom
    png = shots / "serve-head.png"
    chromium(f"--screenshot={png}", "--window-size=1280,1700", url)
    _not_blank(png)


def test_pattern_readout_names_query_and_key(target, tmp_path):
    """The value under the cursor: the served script, on the served pattern table, in Chromium
    (a mouseover dispatched on query 2's key-1 cell; the cells carry no titles or values: the
    value is the table's data-probs entry, printed as the page prints numbers, and equal to the
    pattern API's)."""
    import httpx

    from attnbase.serve.web import fmt_num

    srv, run = target
    head = os.environ.get("ATTNBASE_SERVE_HEAD", "2/1")
    text = httpx.get(f"{srv.url}/runs/{run}/heads/{head}?seq=1", timeout=30).text
    table = text[text.index('<table class="pattern"'):text.index("</table>", text.index(
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
    unescape = html.unescape
    readout = unescape(re.search(r'<span class="readout">(.*?)</span>', dom).group(1))
    rows = [unescape(t) for t in re.findall(r'<th class="qlabel">(.*?)</th>', table)]
    keys = [unescape(t) for t in re.findall(r'<th class="klabel"><span>(.*?)</span></th>', table)]
    layer, head_ = head.split("/")
    api = httpx.get(f"{srv.url}/api/runs/{run}/heads/{layer}/{head_}/pattern",
                    params={"seq": 1}, timeout=30).json()["probs"]
    value = readout.rsplit(": ", 1)[1]
    assert readout == f"q2 {rows[2]} \u2192 k1 {keys[1]}: {value}", readout
    assert value == fmt_num(float(np.float32(api[2][1]))), (value, api[2][1])


def test_readout_prints_numbers_as_the_page_does(target, tmp_path):
    """The script's number format is Python's ``%.4g`` (fmt_num, with the table's data-digits
    of 4 as the pattern carries them), value by value: exponents
    below 1e-4 and from 1e4, rounding that carries (0.99996 -> 1), zero, null (a row with no
    drop_sink values). Negative control: JavaScript's own toPrecision(4) differs on them."""
    import httpx

    from attnbase.formatting import DEFAULT_DIGITS
    from attnbase.serve.web import fmt_num

    srv, _ = target
    values = [1.5e-05, 0.00012346, 0.012345, 0.5, 1.0, 0.99996, 0.0, 12345.6, 3.0e-7, None]
    probs = json.dumps([values])
    cells = "".join("<td></td>" for _ in values)
    script = httpx.get(f"{srv.url}/static/app.js", timeout=30).text
    page = tmp_path / "numbers.html"
    page.write_text(
        '<!doctype html><meta charset="utf-8"><main><span class="readout">-</span>'
        f'<table class="pattern" id="pattern" data-probs="{html.escape(probs)}" '
        f'data-digits="{DEFAULT_DIGITS}"><tr><th></th>'
        + "".join("<th></th>" for _ in values) + f'</tr><tr><th class="qlabel">a</th>{cells}'
        f'</tr></table><pre id="got"></pre></main><script>{script}</script><script>'
        "var got = []; document.querySelectorAll('#pattern td').forEach(function (td) {"
        "td.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
        "got.push(document.querySelector('.readout').textContent.split(': ').pop()); });"
        "var native = JSON.parse(document.getElementById('pattern').getAttribute('data-probs'))[0]"
        ".map(function (v) { return v === null ? 'NULL' : v.toPrecision(4); });"
        "document.getElementById('got').textContent = got.join('|') + '#' + native.join('|');"
        "</script>", encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri())
    got, native = (part.split("|") for part in html.unescape(
        re.search(r'<pre id="got">(.*?)</pre>', dom).group(1)).split("#"))
    want = [fmt_num(v) for v in values]
    assert got == want, got
    assert sum(a != b for a, b in zip(native, want)) >= 5, native
