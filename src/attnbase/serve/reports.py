"""Stored reports: ``/reports/{run}/report.html`` and ``.pdf``, and nothing else of the disk.

A file is served only when the run is in the catalog, the name is one of :data:`FILES`, and the
resolved path (symlinks followed) lies inside ``DIR/reports``; every other path is 404.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from attnbase.errors import NotFoundError
from attnbase.serve.web import catalog

router = APIRouter()

FILES = {"report.html": "text/html; charset=utf-8", "report.pdf": "application/pdf"}


def report_path(cat, run_id: str, name: str):
    if name not in FILES:
        raise NotFoundError(f"no file {name!r} in the reports of run {run_id!r} (served: "
                            f"{', '.join(FILES)})")
    cat.run_row(run_id)
    root = (cat.root / "reports").resolve()
    path = (root / run_id / name).resolve()
    if not path.is_relative_to(root) or path.parent.name != run_id or not path.is_file():
        raise NotFoundError(f"run {run_id!r} has no stored {name}; build it with "
                            f"`attnbase report --db DIR --run {run_id}`")
    return path


@router.get("/reports/{run}/{name}", include_in_schema=False)
def report_file(request: Request, run: str, name: str):
    path = report_path(catalog(request), run, name)
    return FileResponse(path, media_type=FILES[name])
