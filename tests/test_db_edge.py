"""``db`` is made a :class:`~attnbase.warehouse.Database` once, at the edges; inside, every
function takes a Database and nothing else.

An edge accepts what a user gives (a directory or a team database's address, as a str or Path)
and makes the Database there: the CLI's ``--db``, the flows' database directory, the service's
settings, the documented Python API, and the two places a Database is rebuilt in another process.
Every other ``Database(...)`` or ``Database.of(...)`` under ``src/attnbase`` fails here, and so
does a parameter typed as a Database *or* a path outside the edges.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "attnbase"

#: (file under src/attnbase, function) -> why a Database is made there from a path or address.
EDGES: dict[tuple[str, str], str] = {
    ("commands/dbopt.py", "open_database"): "the CLI: every command's --db",
    ("flows/_stages.py", "open_db"): "the flows: the database directory their tasks carry",
    ("serve/catalog.py", "Catalog.__init__"): "the service: its settings' database",
    ("serve/client.py", "attach_lake"): "Python API: attnbase.attach_lake(address)",
    ("__init__.py", "extract_run"): "Python API: attnbase.extract_run(db, ...)",
    ("warehouse/runs/reader.py", "open_run"): "Python API: warehouse.open_run (docs/api.md)",
    ("warehouse/sandbox/sql.py", "read_sql"): "Python API: warehouse.read_sql (docs/internals.md)",
    ("warehouse/sandbox/sql.py", "query_arrow"): "Python API: read_sql's Arrow twin",
    ("reports/render.py", "build_report"): "Python API: reports.build_report(db, ...)",
    ("warehouse/sandbox/querychild.py", "_connection"): "another process: a query process's request",
    ("warehouse/runs/writer.py", "RunWriter._db"): "another process: a writer sent to a worker",
}

#: Functions that may type a parameter as a Database or a path: the edges that take a path from a
#: user, and ``Database.of`` / ``location`` (which turn either into one thing).
EITHER_TYPE: set[tuple[str, str]] = {
    ("warehouse/runs/reader.py", "open_run"),
    ("warehouse/sandbox/sql.py", "read_sql"),
    ("warehouse/sandbox/sql.py", "query_arrow"),
    ("reports/render.py", "build_report"),
    ("warehouse/database.py", "Database.of"),
    ("warehouse/database.py", "location"),
}


@lru_cache(maxsize=4)
def _trees(src: Path) -> tuple[tuple[str, ast.Module], ...]:
    """Every module under ``src``, parsed once: ``(path relative to src, tree)``."""
    return tuple((path.relative_to(src).as_posix(), ast.parse(path.read_text(), filename=str(path)))
                 for path in sorted(src.rglob("*.py")))


def _functions(tree: ast.AST):
    """``(qualname, node)`` of every function, methods as ``Class.method``."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.<locals>.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _makes_database(call: ast.Call) -> bool:
    f = call.func
    return ((isinstance(f, ast.Name) and f.id == "Database")
            or (isinstance(f, ast.Attribute) and f.attr == "of"
                and isinstance(f.value, ast.Name) and f.value.id == "Database"))


@lru_cache(maxsize=4)
def database_makers(src: Path) -> dict[tuple[str, str], int]:
    """``{(file, function): line}`` of every ``Database(...)`` / ``Database.of(...)`` call."""
    found: dict[tuple[str, str], int] = {}
    for rel, tree in _trees(src):
        for name, fn in _functions(tree):
            inner = {id(n) for _, sub in _functions(fn) for n in ast.walk(sub)}
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and id(node) not in inner and _makes_database(node):
                    found.setdefault((rel, name), node.lineno)
        top = {id(n) for _, fn in _functions(tree) for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and id(node) not in top and _makes_database(node):
                found.setdefault((rel, "<module>"), node.lineno)
    return found


def either_typed(src: Path) -> dict[tuple[str, str], str]:
    """``{(file, function): parameter}`` of parameters typed as a Database or a str/Path."""
    found: dict[tuple[str, str], str] = {}
    for rel, tree in _trees(src):
        for name, fn in _functions(tree):
            for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
                if arg.annotation is None:
                    continue
                text = ast.unparse(arg.annotation).strip("'\"")
                words = {w.strip() for w in text.split("|")}
                if "Database" in words and words & {"str", "Path"}:
                    found[(rel, name)] = arg.arg
    return found


def test_a_database_is_made_only_at_the_edges():
    made = database_makers(SRC)
    inside = {f"{f}:{n} (line {line})" for (f, n), line in made.items() if (f, n) not in EDGES}
    assert not inside, (
        "a Database is made from a path inside the library; take a Database from the caller "
        "and make it at the edge (tests/test_db_edge.py EDGES): " + ", ".join(sorted(inside)))


def test_every_listed_edge_still_makes_one():
    made = database_makers(SRC)
    stale = sorted(f"{f}:{n}" for f, n in EDGES if (f, n) not in made)
    assert not stale, f"EDGES lists functions that no longer make a Database: {stale}"


def test_inside_a_db_parameter_has_one_type():
    mixed = {f"{f}:{n}({p})" for (f, n), p in either_typed(SRC).items()
             if (f, n) not in EITHER_TYPE}
    assert not mixed, ("a parameter typed as a Database or a path inside the library; type it "
                       "Database and coerce at the edge: " + ", ".join(sorted(mixed)))


def test_the_checks_see_a_maker_and_a_mixed_type(tmp_path):
    """Negative control: a library function that makes its own Database and one typed as
    either are both found."""
    (tmp_path / "stats").mkdir()
    (tmp_path / "stats" / "x.py").write_text(
        "def f(db: 'Database | str'):\n    return Database.of(db)\n"
        "class C:\n    def g(self, db: Database | Path):\n        return Database(db)\n")
    assert database_makers(tmp_path) == {("stats/x.py", "f"): 2, ("stats/x.py", "C.g"): 5}
    assert either_typed(tmp_path) == {("stats/x.py", "f"): "db", ("stats/x.py", "C.g"): "db"}
