"""The building blocks a report section returns, and the section registry itself.

A :class:`Section` is one registered unit of a report: a name, a title, a ``has_data`` predicate
on what the catalog holds and a ``render`` function returning a list of blocks. The report
includes every registered section whose data exists; the others appear as a visible note saying
what is missing and which command computes it. Register new statistic families with
:func:`register_section`.

Sections without data are never rendered as empty sections: :func:`render_sections` marks them
``present=False`` and the report lists them once, at its top, each with the command line that
computes its data (:meth:`Section.command_line`, formatted for this database and run). A
section module only declares ``what`` and ``command``; it never writes its own "missing" note.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from attnbase.reports.data import RunData

if TYPE_CHECKING:
    from attnbase.warehouse import Database


@dataclass(frozen=True)
class Context:
    """What a section sees: the report's run, the runs it is compared with (may be empty) and
    the database they are read from (None: the sections read only the runs' rows)."""

    run: RunData
    compare: tuple[RunData, ...] = ()
    db: Database | None = None

    @property
    def all_runs(self) -> tuple[RunData, ...]:
        return (self.run, *self.compare)


@dataclass(frozen=True)
class Para:
    html: Markup
    kind: str = "para"


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]  # cells: str / Markup / number (formatted by the template)
    caption: str = ""
    kind: str = "table"
    #: the leading columns that name a row: repeated in every part of a table split to fit
    #: the page (reports/fit.py)
    keys: int = 1
    #: which columns a part of a split table holds ("Columns H0 to H9 (1 of 3)")
    part: str = ""


@dataclass(frozen=True)
class Fig:
    svg: str
    caption: Markup | str
    title: str = ""
    kind: str = "figure"

    @property
    def drawn(self) -> tuple[str, ...] | None:
        """What the figure draws (``figures.SVG.drawn``); None for an SVG that does not say."""
        return getattr(self.svg, "drawn", None)


@dataclass(frozen=True)
class Grid:
    """Small figures side by side (heatmaps)."""

    figures: Sequence[Fig]
    caption: Markup | str = ""
    kind: str = "grid"

    @property
    def drawn(self) -> tuple[str, ...] | None:
        parts = [f.drawn for f in self.figures]
        if any(p is None for p in parts):
            return None
        return tuple(dict.fromkeys(x for p in parts for x in p))


@dataclass(frozen=True)
class Note:
    text: str
    kind: str = "note"


Block = Para | Table | Fig | Grid | Note


@dataclass(frozen=True)
class Section:
    """One registered report section.

    ``what`` and ``command`` fill the note shown when ``has_data`` is false:
    "no <what> in the catalog for this run; run `<command>` to compute it". Sections with
    ``note_when_missing=False`` (e.g. the comparison, which needs ``--compare``) are left out
    silently instead.
    """

    name: str
    title: str
    has_data: Callable[[Context], bool]
    render: Callable[[Context], list[Block]]
    what: str = ""
    command: str = "attnbase analyze"
    metrics_ref: str = ""  # docs/metrics.md section(s), e.g. "§3"
    note_when_missing: bool = True

    def command_line(self, ctx: "Context | None" = None) -> str:
        """The real command that computes this section's data for ``ctx``'s database and run.

        ``command`` may use ``{db}``, ``{run}`` and ``{model}``; a command that names no
        ``--run`` gets ``--db DB --run RUN`` appended.
        """
        if ctx is None:
            return self.command
        fields = {"db": ctx.db.name if ctx.db is not None else "DB", "run": ctx.run.run_id,
                  "model": ctx.run.run.get("model") or "MODEL"}
        if "{" in self.command:
            return self.command.format(**fields)
        if "--run" in self.command:
            return self.command
        return f"{self.command} --db {fields['db']} --run {fields['run']}"

    def missing_note(self, ctx: "Context | None" = None) -> str:
        return (f"no {self.what} in the catalog for this run; run `{self.command_line(ctx)}` "
                "to compute it")


@dataclass(frozen=True)
class RenderedSection:
    name: str
    title: str
    present: bool
    blocks: list[Block] = field(default_factory=list)
    note: str = ""
    metrics_ref: str = ""
    what: str = ""
    command: str = ""


SECTIONS: list[Section] = []


def register_section(section: Section, *, before: str | None = None) -> Section:
    """Add ``section`` to the registry (at the end, or before the section named ``before``)."""
    if any(s.name == section.name for s in SECTIONS):
        raise ValueError(f"report section {section.name!r} is already registered")
    if before is None:
        SECTIONS.append(section)
    else:
        names = [s.name for s in SECTIONS]
        if before not in names:
            raise ValueError(f"no report section {before!r}; registered: {', '.join(names)}")
        SECTIONS.insert(names.index(before), section)
    return section


def render_sections(ctx: Context) -> list[RenderedSection]:
    """Render every registered section for ``ctx``, in registry order."""
    out = []
    for s in SECTIONS:
        if s.has_data(ctx):
            out.append(RenderedSection(s.name, s.title, True, s.render(ctx),
                                       metrics_ref=s.metrics_ref))
        elif s.note_when_missing:
            out.append(RenderedSection(s.name, s.title, False, note=s.missing_note(ctx),
                                       metrics_ref=s.metrics_ref, what=s.what,
                                       command=s.command_line(ctx)))
    return out


def left_out(rendered: Sequence[RenderedSection]) -> list[RenderedSection]:
    """The sections without data, in registry order (listed once at the top of a report)."""
    return [r for r in rendered if not r.present]
