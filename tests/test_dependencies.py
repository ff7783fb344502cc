"""Declared requirements match the imports: every third-party package ``src/attnbase`` imports
(top-level or inside a function) is declared in pyproject.toml, and every declared requirement
is either imported or listed below with the library that uses it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import lru_cache
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# requirements src/ never imports, each with what uses it
USED_THROUGH = {
    "dask": "prefect-dask's DaskTaskRunner runs tasks on dask.distributed (flows/runners.py)",
    "gguf": "transformers reads the Gemma-3 / SmolLM2 GGUF files through it (extract/packaged.py)",
    "accelerate": "transformers needs it to load a GGUF checkpoint",
    "uvloop": "uvicorn's event loop, picked up when installed (attnbase serve)",
    "python-multipart": "FastAPI parses the login form with it (serve/app.py)",
    "duckdb-extension-ducklake": "its DuckLake extension file is loaded by path "
                                 "(warehouse/catalog/lake_extensions.py)",
    "duckdb-extension-postgres": "its postgres extension file is loaded by path "
                                 "(warehouse/catalog/lake_extensions.py)",
    "duckdb-extension-httpfs": "its httpfs extension file is loaded by path for a team "
                               "database on S3 (warehouse/catalog/lake_extensions.py)",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.match(r"[A-Za-z0-9_.\-]+", req.strip()).group(0))


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


#: extras for working on attnbase, not for running it
TOOLING_EXTRAS = ("dev", "bench", "docs")


def _runtime_requirements() -> set[str]:
    """The plain install's requirements and every runtime extra's (the [all] install)."""
    project = _project()
    names = {_requirement_name(r) for r in project["dependencies"]}
    for extra, reqs in project["optional-dependencies"].items():
        if extra not in TOOLING_EXTRAS:
            names |= {_requirement_name(r) for r in reqs if not r.startswith("attnbase[")}
    return names


def _top_level_imports(root: Path) -> dict[str, set[str]]:
    """``{top-level module: {files}}`` of every absolute import under ``root``."""
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def _third_party(imports: dict[str, set[str]], own: set[str]) -> dict[str, set[str]]:
    return {m: f for m, f in imports.items()
            if m not in sys.stdlib_module_names and m not in own}


@lru_cache(maxsize=1)
def _installed() -> dict[str, list[str]]:
    return packages_distributions()


def _distributions(modules) -> dict[str, str]:
    """``{module: distribution}``; a module no installed distribution provides maps to itself."""
    dists = _installed()
    return {m: _norm(dists.get(m, [m])[0]) for m in modules}


def test_every_import_of_src_is_declared():
    declared = _runtime_requirements()
    imports = _third_party(_top_level_imports(ROOT / "src" / "attnbase"), {"attnbase"})
    missing = {f"{m} ({d}, in {sorted(imports[m])[0]})"
               for m, d in _distributions(imports).items() if d not in declared}
    assert not missing, f"imported by src/ but in no runtime requirement: {sorted(missing)}"


def test_every_declared_requirement_is_imported_or_explained():
    declared = _runtime_requirements()
    imported = set(_distributions(
        _third_party(_top_level_imports(ROOT / "src" / "attnbase"), {"attnbase"})).values())
    unexplained = declared - imported - set(USED_THROUGH)
    assert not unexplained, (f"declared but never imported by src/: {sorted(unexplained)}; "
                             "remove them or add each to USED_THROUGH with what uses it")
    stale = set(USED_THROUGH) & imported
    assert not stale, f"USED_THROUGH lists packages src/ imports directly: {sorted(stale)}"
    assert set(USED_THROUGH) <= declared, "USED_THROUGH names packages that are not declared"


def test_extras_do_not_repeat_requirements():
    project = _project()
    main = [_requirement_name(r) for r in project["dependencies"]]
    assert len(main) == len(set(main)), "a requirement is declared twice"
    for extra, reqs in project["optional-dependencies"].items():
        names = [_requirement_name(r) for r in reqs if not r.startswith("attnbase[")]
        assert len(names) == len(set(names)), f"the {extra} extra repeats a package"
        assert not set(names) & set(main), (
            f"the {extra} extra repeats main requirements: {sorted(set(names) & set(main))}")


def test_every_import_of_the_tests_is_declared():
    project = _project()
    declared = {_requirement_name(r) for r in project["dependencies"]}
    for reqs in project["optional-dependencies"].values():
        declared |= {_requirement_name(r) for r in reqs if not r.startswith("attnbase[")}
    # the tests' own helper modules, and benchmarks/ scripts a test imports by file name
    own = {"attnbase"} | {p.stem for d in ("tests", "benchmarks") for p in (ROOT / d).rglob("*.py")}
    imports = _third_party(_top_level_imports(ROOT / "tests"), own)
    missing = {f"{m} ({d})" for m, d in _distributions(imports).items() if d not in declared}
    assert not missing, f"imported by tests/ but in no requirement or extra: {sorted(missing)}"


def _extra(name: str) -> dict[str, str]:
    """``{requirement name: requirement text}`` of one extra."""
    return {_requirement_name(r): r for r in _project()["optional-dependencies"][name]}


def test_extras_repeat_their_parts_exactly():
    """pyproject repeats requirements instead of naming attnbase[...] inside an extra (pip's
    resolver backtracked for over 5 min on that; 21 s flat): the repeats must stay equal."""
    extras = _project()["optional-dependencies"]
    runtime = [e for e in extras if e not in TOOLING_EXTRAS and e != "all"]
    union = {}
    for e in runtime:
        union.update(_extra(e))
    assert _extra("all") == union, "[all] must hold exactly every runtime extra's requirements"
    for whole, parts in (("serve", ("analysis", "reports")),
                         ("flows", ("extract", "analysis", "reports"))):
        for part in parts:
            for name, req in _extra(part).items():
                assert _extra(whole).get(name) == req, (
                    f"[{whole}] must repeat [{part}]'s {req!r} as it is")
    texts = {}
    for e in extras:
        for name, req in _extra(e).items():
            assert texts.setdefault(name, req) == req, f"{name} is declared as {texts[name]!r} and {req!r}"


def test_the_missing_extra_map_follows_pyproject():
    """attnbase.extras names, for a missing module, an extra that installs it (declared there,
    or brought by one of its requirements), and for a command a command that exists."""
    from importlib.metadata import requires

    from attnbase.cli import COMMAND_MODULES
    from attnbase.extras import COMMAND_EXTRA, MODULE_EXTRA

    extras = _project()["optional-dependencies"]
    dists = _distributions(MODULE_EXTRA)
    for module, extra in MODULE_EXTRA.items():
        if module not in _installed():
            continue  # the other import name of a package (multipart / python_multipart)
        declared = {_requirement_name(r) for r in extras[extra]}
        brought = {_requirement_name(r) for d in declared for r in (requires(d) or [])
                   if "extra ==" not in r}
        assert dists[module] in declared | brought, (
            f"attnbase.extras maps {module} to [{extra}], which does not install it")
    commands = set(COMMAND_MODULES) | {"schedule", "table1"}
    assert set(COMMAND_EXTRA) <= commands and set(COMMAND_EXTRA.values()) <= set(extras)
