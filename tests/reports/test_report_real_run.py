"""A report from a real tiny run: extract (tiny-gpt2) -> analyze -> report, through the CLI."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from pypdf import PdfReader

pytestmark = pytest.mark.slow


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "attnbase.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**__import__("os").environ,
                                                       "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_report_from_a_real_tiny_run(tmp_path):
    db = tmp_path / "db"
    _cli("extract", "--db", str(db), "--model", "tiny-gpt2", "--seqs", "4", "--seq-len", "32",
         "--run", "tg", "--device", "cpu", "--quiet")
    _cli("analyze", "--db", str(db), "--run", "tg", "--draws", "5", "--gauss-draws", "10",
         "--no-progress")
    out = _cli("report", "--db", str(db), "--run", "tg").split()
    assert out == [str(db / "reports" / "tg" / "report.html"),
                   str(db / "reports" / "tg" / "report.pdf")]
    html = (db / "reports" / "tg" / "report.html").read_text()
    present = set(re.findall(r'class="present" data-section="(\w+)"', html))
    assert {"table1", "norm_cv", "ve", "max_share", "head_maps", "concentration", "entropy",
            "methods"} <= present
    methods = html[html.index('data-section="methods"'):]
    for text in ("statistics backend", "numba", "store dtype", "device name", "CUDA"):
        assert text in methods, text  # what computed the run (its config)
    assert re.search(r"<td>device</td><td>cpu</td>", methods)
    text = " ".join(p.extract_text() or "" for p in PdfReader(str(db / "reports/tg/report.pdf")).pages)
    assert "tg" in text and "Methods" in text
