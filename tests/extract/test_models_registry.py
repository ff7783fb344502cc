"""`attnbase models` and docs/models.md come from one registry and agree; proven types are
exactly those a parity test builds."""

from __future__ import annotations

import json
from pathlib import Path

from attnbase.extract.proven import PROVEN, PROVEN_BY_ADAPTER_TESTS
from attnbase.extract.registry import PARITY_TEST, markdown, model_rows

ROOT = Path(__file__).resolve().parents[2]


def _page_rows(text: str) -> dict[str, tuple[str, bool]]:
    """model type -> (served, proven) of docs/models.md's table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[3] == "yes")
    return rows


def test_docs_models_md_is_the_registry():
    """Under the transformers the page was generated with (the lock's), the page is the
    registry byte for byte; under another one (make test-latest), every proven row of the page
    is proven and served by the installed registry, and no other type is proven."""
    import transformers

    got = (ROOT / "docs" / "models.md").read_text()
    page = _page_rows(got)
    assert len(page) >= 100, "docs/models.md has no model table"
    if f"transformers {transformers.__version__}:" in got:
        assert got == markdown(), ("docs/models.md is stale: "
                                   "python -m attnbase.extract.registry > docs/models.md")
        return
    rows = {r.model_type: r for r in model_rows()}
    page_proven = {t for t, (_, proven) in page.items() if proven}
    assert page_proven == {t for t, r in rows.items() if r.proven}
    assert all(rows[t].served != "no" for t in page_proven)


def test_page_rows_read_the_table():
    rows = _page_rows(markdown())
    assert rows["falcon"][1] and rows["mpt"] == ("no", False)
    assert len(rows) == len(model_rows())


def test_proven_types_are_the_tested_ones():
    rows = {r.model_type: r for r in model_rows()}
    proven = {t for t, r in rows.items() if r.proven}
    assert proven == set(PROVEN) | set(PROVEN_BY_ADAPTER_TESTS)
    assert len(proven) >= 25
    assert all(rows[t].served != "no" for t in proven)
    assert all(rows[t].proven == PARITY_TEST for t in PROVEN)
    for path in set(PROVEN_BY_ADAPTER_TESTS.values()) | {PARITY_TEST}:
        assert (ROOT / path).is_file(), path
    # the hand-written adapters keep their types; the rest of the named families are generic
    assert rows["mistral"].served == "adapter:llama" and rows["bloom"].served == "adapter:bloom"
    assert rows["qwen3"].served == rows["modernbert"].served == "generic"
    assert rows["mpt"].served == "no" and "attention interface" in rows["mpt"].note


def test_models_command_prints_the_registry():
    from typer.testing import CliRunner

    from attnbase.cli import app

    res = CliRunner().invoke(app, ["models", "--proven", "-f", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["model_type"] for r in rows} == set(PROVEN) | set(PROVEN_BY_ADAPTER_TESTS)
    res = CliRunner().invoke(app, ["models", "-f", "markdown"])
    assert res.exit_code == 0 and res.stdout == markdown()  # the page of the installed transformers
