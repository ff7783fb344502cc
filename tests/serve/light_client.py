"""Run attnbase as the plain ``pip install attnbase`` would leave it (no extras), from this
venv: ``python -S`` over a site directory that links only the distributions of the plain
install's dependency closure, so that nothing else can be imported or found.

``python light_client.py cli ARGS...``: ``attnbase ARGS...`` (its exit code);
``python light_client.py client URL RUN``: the notebook client against a served database,
printing one JSON line of what it read; ``python light_client.py store DB RUN``: ``open_run``;
``python light_client.py blocked``: the modules left out.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", req).group(0)).lower()


def _requires(name: str) -> list[str]:
    """``name``'s requirements: attnbase's from this checkout's pyproject.toml (the install in
    the venv may predate it), any other distribution's from its installed metadata."""
    if name == "attnbase":
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    try:
        return md.distribution(name).requires or []
    except md.PackageNotFoundError:
        return []


def plain_closure(root: str = "attnbase") -> set[str]:
    """The distributions ``pip install ROOT`` installs: requirements without an extra marker,
    followed recursively (markers other than extras evaluated for this interpreter)."""
    from packaging.requirements import Requirement

    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        reqs = _requires(name)
        for r in reqs:
            req = Requirement(r)
            if req.marker is not None and "extra" in str(req.marker):
                continue
            if req.marker is None or req.marker.evaluate():
                todo.append(_name(req.name))
    return seen


def blocked_modules() -> set[str]:
    """Top-level modules of every installed distribution outside :func:`plain_closure`."""
    keep = plain_closure() | {"pip", "setuptools", "wheel", "packaging"}
    return {mod for mod, dists in md.packages_distributions().items()
            if all(_name(d) not in keep for d in dists)
            and mod not in sys.stdlib_module_names and mod != "attnbase"}


def light_site(where: Path) -> Path:
    """A site directory holding links to the files of the plain install's distributions only
    (their packages, modules and metadata): what ``pip install attnbase`` would leave."""
    import attnbase

    keep = plain_closure() | {"packaging"}
    site = where / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    for dist in md.distributions():
        name = _name(dist.metadata["Name"])
        if name not in keep or name == "attnbase":
            continue
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            if top == ".." or top.endswith(".pth") or (site / top).exists():
                continue
            (site / top).symlink_to(base / top)
    src = Path(attnbase.__file__).resolve().parent.parent
    (site / "attnbase").symlink_to(src / "attnbase")
    return site


def relaunch(argv: list[str]) -> int:
    """Run this script again with ``python -S`` over :func:`light_site` alone."""
    with tempfile.TemporaryDirectory() as tmp:
        site = light_site(Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(site),
               "ATTNBASE_LIGHT": json.dumps(sorted(blocked_modules()))}
        return subprocess.run([sys.executable, "-S", __file__, *argv], env=env).returncode


def main(argv: list[str]) -> int:
    if "ATTNBASE_LIGHT" not in os.environ:
        return relaunch(argv)
    blocked = set(json.loads(os.environ["ATTNBASE_LIGHT"]))
    mode, *args = argv
    if mode == "blocked":
        importable = sorted(m for m in blocked if _importable(m))
        print(json.dumps({"blocked": sorted(blocked), "importable": importable}))
        return 0
    if mode == "cli":
        sys.argv = ["attnbase", *args]
        from attnbase.cli import main as cli_main

        try:
            cli_main()
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0
    if mode == "client":
        import numpy as np
        import polars as pl

        import attnbase

        url, run = args
        with attnbase.connect(url) as svc:
            runs = svc.runs()
            p = svc.pattern(run, 1, 0, seq=0)
            html = p._repr_html_()
        print(json.dumps({
            "runs_is_polars": isinstance(runs, pl.DataFrame), "runs": runs["run_id"].to_list(),
            "shape": list(p.probs.shape), "row_sums": np.nansum(p.probs, axis=1).tolist(),
            "min": float(np.nanmin(p.probs)), "html_cells": html.count("<td ")}))
        return 0
    if mode == "store":
        import attnbase
        from attnbase.errors import MissingExtraError

        db, run = args
        ds = attnbase.open_run(db, run)
        out = {"keys_sum": float(ds["keys"].isel(layer=0).sum()), "dims": list(ds["keys"].dims)}
        try:
            ds["attn_logits"].isel(layer=0).values
        except MissingExtraError as err:
            out["attn_logits"] = str(err)
        print(json.dumps(out))
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
