"""Assemble a run report: catalog -> sections -> Jinja2 HTML -> WeasyPrint PDF.

``build_report(db, run_id, compare=(), out_dir=None)`` writes
``DIR/reports/<run_id>/report.html`` and ``report.pdf`` (or into ``out_dir``) atomically. It is
the reports' edge: ``db`` (a directory, a team database's address or a
:class:`~attnbase.warehouse.Database`) becomes a Database there; everything below takes one.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from attnbase._version import __version__
from attnbase.reports import methods as _methods  # noqa: F401  (registers the methods section)
from attnbase.reports import sections as _sections  # noqa: F401  (registers the sections)
from attnbase.errors import ReportError
from attnbase.reports.blocks import Context, RenderedSection, left_out, render_sections
from attnbase.reports.fit import fit_blocks
from attnbase.reports.data import load_run, require_runs

if TYPE_CHECKING:
    from attnbase.warehouse import Database


@dataclass(frozen=True)
class ReportPaths:
    """Where a report was written, and the warnings its first page carries."""

    html: Path
    pdf: Path
    warnings: tuple[str, ...] = ()


#: Run statuses a report refuses: the extraction stopped, so its rows are a fragment.
UNREPORTABLE = ("failed", "interrupted")


def is_analysed(run) -> bool:
    """Whether ``attnbase analyze`` has written anything for ``run`` (a RunData)."""
    return bool(run.run_metrics) or run.head_metrics.height > 0


def report_warnings(run, db: Database) -> tuple[str, ...]:
    """What the report must say at its top about the state of ``run`` (a RunData)."""
    out = []
    status = run.run.get("status")
    if status != "complete":
        out.append(f"run status is {status!r}: the catalog holds only part of this run's rows")
    if not is_analysed(run):
        out.append(f"run {run.run_id!r} has not been analysed: this report shows row statistics "
                   f"only; run `attnbase analyze --db {db.name} --run {run.run_id}` first")
    return tuple(out)


def check_reportable(run) -> None:
    status = run.run.get("status")
    if status in UNREPORTABLE:
        raise ReportError(
            f"run {run.run_id!r} has status {status!r}: its extraction did not finish, so a "
            f"report would describe a fragment; resume it with `attnbase extract ... --run "
            f"{run.run_id}` (same arguments), then report")


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("attnbase.reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"], default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_html(db: Database, run_id: str, compare: tuple[str, ...] = ()) -> str:
    """The report for ``run_id`` (compared with ``compare``) as one self-contained HTML string.

    Raises :class:`~attnbase.errors.RunNotFoundError` for any unknown run id.
    """
    compare = tuple(r for r in dict.fromkeys(compare) if r != run_id)
    require_runs(db, (run_id, *compare))  # fail before any work on a mistyped id
    run = load_run(db, run_id)
    others = tuple(load_run(db, r) for r in compare)
    for r in (run, *others):
        check_reportable(r)
    ctx = Context(run=run, compare=others, db=db)
    rendered: list[RenderedSection] = render_sections(ctx)
    counter = itertools.count(1)
    model = run.run.get("model") or "?"
    title = f"attnbase report: {run_id}"
    if others:
        title += " vs " + ", ".join(o.run_id for o in others)
    subtitle = (f"{model} (revision {run.run.get('model_revision') or 'n/a'}), "
                f"{run.run.get('n_layers')} layers × {run.run.get('n_heads')} heads, "
                f"{run.run.get('n_seqs')} sequences × {run.run.get('seq_len')} tokens of "
                f"{run.run.get('corpus')}, {run.run.get('dtype')}")
    return _env().get_template("report.html.j2").render(
        title=title,
        subtitle=subtitle,
        run_id=run_id,
        config_hash=run.run.get("config_hash") or "n/a",
        db_name=db.name,
        version=__version__,
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        sections=[replace(r, blocks=fit_blocks(r.blocks)) for r in rendered if r.present],
        left_out=left_out(rendered),
        warnings=report_warnings(run, db),
        fig_no=lambda _name: next(counter),
    )


def _umask_mode() -> int:
    """``0o666`` less the process umask: the mode ``open()`` gives a new file (mkstemp's 0600
    would hide a report from the group on a shared machine). Linux reads the umask from
    /proc (setting it to read it back is not thread-safe); elsewhere it is set and restored."""
    try:
        with open("/proc/self/status") as fh:
            mask = next(int(ln.split()[1], 8) for ln in fh if ln.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename; the
    file gets the umask's mode, like any file the user writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _umask_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_report(
    db: Database | str | Path,
    run_id: str,
    compare: tuple[str, ...] | list[str] = (),
    out_dir: Path | str | None = None,
) -> ReportPaths:
    """Render the HTML and PDF report of ``run_id`` (with ``compare`` runs side by side).

    ``db``: a database directory, a team database's address or a Database. Default output:
    ``DIR/reports/<run_id>/report.{html,pdf}``. The PDF is rendered by
    WeasyPrint from the same HTML, so its text is extractable. Both files are written
    atomically. Raises :class:`~attnbase.errors.RunNotFoundError` for an unknown run.
    """
    from attnbase.reports.data import reports_dir
    from attnbase.reports.pdf import html_to_pdf
    from attnbase.warehouse import Database

    db = Database.of(db)
    out = Path(out_dir) if out_dir is not None else reports_dir(db) / run_id
    html = render_html(db, run_id, tuple(compare))
    paths = ReportPaths(html=out / "report.html", pdf=out / "report.pdf",
                        warnings=report_warnings(load_run(db, run_id), db))
    write_atomic(paths.html, html.encode("utf-8"))
    write_atomic(paths.pdf, html_to_pdf(html, base_url=out))
    return paths
