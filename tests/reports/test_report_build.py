"""build_report writes HTML + PDF atomically; the PDF's text is extractable; errors are one line."""

from __future__ import annotations

import sys

import pytest
from pypdf import PdfReader

from attnbase.errors import RunNotFoundError
from attnbase.reports import build_report


def test_default_location_and_no_temp_files(catalog, compared):
    out = catalog / "reports" / "gpt2-a"
    assert compared.html == out / "report.html" and compared.pdf == out / "report.pdf"
    assert compared.html.stat().st_size > 10_000
    assert compared.pdf.read_bytes()[:5] == b"%PDF-"
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.pdf"]


def test_pdf_text_is_extractable(compared):
    reader = PdfReader(str(compared.pdf))
    assert len(reader.pages) >= 3
    text = " ".join(page.extract_text() or "" for page in reader.pages)
    for needle in ("attnbase report", "gpt2-a", "neox-b", "Collapse signature", "Methods",
                   "cfg-gpt2-a", "Look for"):
        assert needle in text, needle


def test_out_dir(catalog, tmp_path):
    """Written into ``out_dir``; ``build_report`` takes a Database as well as a path."""
    import os

    from attnbase.warehouse import Database

    old = os.umask(0o027)  # a group-readable umask: the files get its mode, not mkstemp's 0600
    try:
        paths = build_report(Database(catalog), "bare", out_dir=tmp_path / "x")
    finally:
        os.umask(old)
    assert {p.stat().st_mode & 0o777 for p in (paths.html, paths.pdf)} == {0o640}
    assert (paths.html, paths.pdf) == (tmp_path / "x" / "report.html", tmp_path / "x" / "report.pdf")
    # 'bare' was extracted in part and never analysed: the report says so rather than staying silent
    assert any("has not been analysed" in w for w in paths.warnings)
    assert paths.pdf.is_file() and "Rank collapse across depth" in paths.html.read_text()


@pytest.mark.parametrize("run, compare", [("nope", ()), ("gpt2-a", ("nope",))])
def test_unknown_run_is_one_line(catalog, tmp_path, run, compare):
    with pytest.raises(RunNotFoundError) as err:
        build_report(catalog, run, compare=compare, out_dir=tmp_path / "o")
    msg = str(err.value)
    assert "\n" not in msg and "'nope'" in msg and "gpt2-a" in msg
    assert not (tmp_path / "o").exists()


def _cli(monkeypatch, *args):
    from attnbase import cli

    monkeypatch.setattr(sys, "argv", ["attnbase", *args])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    return ex.value.code


def test_cli_unknown_run(monkeypatch, capsys, catalog):
    code = _cli(monkeypatch, "report", "--db", str(catalog), "--run", "nope")
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: run 'nope' not found")


def test_cli_prints_paths(monkeypatch, capsys, catalog, tmp_path):
    from attnbase import cli

    monkeypatch.setattr(sys, "argv", ["attnbase", "report", "--db", str(catalog), "--run",
                                      "bare", "--compare", "neox-b", "--out", str(tmp_path)])
    try:
        cli.main()
    except SystemExit as ex:  # typer may exit 0 after a command
        assert ex.code in (0, None)
    lines = capsys.readouterr().out.split()
    assert lines == [str(tmp_path / "report.html"), str(tmp_path / "report.pdf")]
    assert "neox-b" in (tmp_path / "report.html").read_text()
