"""Private names of dependencies (attnbase.private_api, docs/toolchain.md): every declared one
resolves in the installed versions, the docs table is the code list, and src/ uses no private
name that is not declared. Each check has a negative control."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from attnbase import private_api
from attnbase.errors import AttnbaseError
from attnbase.private_api import (PRIVATE_NAMES, PrivateName, PrivateNameGoneError, missing,
                                  read, resolve)

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "attnbase"

#: Modules of dependencies whose contents are undocumented internals: anything imported from
#: them, or named in a string under them, must be declared.
INTERNAL = ("transformers.models", "uvicorn.protocols", "uvicorn.config", "uvicorn.lifespan",
            "typer.core", "typer.rich_utils", "typer.main", "typer._click", "click.core",
            "prefect.server", "torch._", "starlette._", "fastapi._")


@pytest.mark.parametrize("entry", [p for p in PRIVATE_NAMES if not p.optional],
                         ids=lambda p: p.name)
def test_declared_private_name_resolves(entry):
    try:
        private_api.lookup(entry.name, entry.dependency)
    except PrivateNameGoneError as err:
        pytest.fail(str(err), pytrace=False)


def test_missing_name_fails_with_one_line():
    """Negative control: a declared name the installed version lacks fails the check above with
    the one line naming it, its distribution's version and the docs."""
    tf = version("transformers")
    gone = (PrivateName("transformers",
                        "transformers.models.falcon.modeling_falcon.NO_SUCH_ATTENTION_CLASSES",
                        "nowhere", "control", "control"),
            PrivateName("uvicorn", "uvicorn.protocols.http.no_such_impl.Protocol", "nowhere",
                        "control", "control"))
    assert missing(gone) == [
        f"transformers.models.falcon.modeling_falcon.NO_SUCH_ATTENTION_CLASSES is gone in "
        f"transformers {tf}: see docs/toolchain.md",
        f"uvicorn.protocols.http.no_such_impl.Protocol is gone in uvicorn {version('uvicorn')}: "
        "see docs/toolchain.md"]
    # an optional name is not an error where it is absent; the same name required is
    assert missing((PrivateName("transformers", gone[0].name, "", "", "", optional=True),)) == []
    assert missing(PRIVATE_NAMES) == []  # control: every declared required name is there


def test_runtime_guard_is_one_line_exit_2(monkeypatch):
    """A call site that reaches a dropped name raises the one-line AttnbaseError (the CLI prints
    it and exits 2), not an AttributeError."""
    import uvicorn.protocols.http.httptools_impl as impl

    from attnbase.serve.deadlines import protocol_class
    from attnbase.serve.settings import Settings

    resolve.cache_clear()
    monkeypatch.delattr(impl, "HttpToolsProtocol")
    try:
        with pytest.raises(PrivateNameGoneError) as err:
            protocol_class(Settings(db=Path(".")))
    finally:
        resolve.cache_clear()
    assert isinstance(err.value, AttnbaseError) and err.value.exit_code == 2
    assert str(err.value) == (
        "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol is gone in uvicorn "
        f"{version('uvicorn')}: see docs/toolchain.md")
    with pytest.raises(PrivateNameGoneError, match=r"_attn_implementation is gone in transformers"):
        read(object(), "transformers.PretrainedConfig._attn_implementation")
    with pytest.raises(KeyError, match="not declared"):
        resolve("uvicorn.Server.not_declared")


def test_docs_table_is_the_code_list():
    text = (ROOT / "docs" / "toolchain.md").read_text()
    assert "## Private names of dependencies we use" in text
    section = text.split("## Private names of dependencies we use", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert "\n".join(rows) == private_api.table(), (
        "docs/toolchain.md's private-name table differs from attnbase.private_api: regenerate it "
        "with `python -m attnbase.private_api`")
    names = [r.split("`")[1] for r in rows[2:]]
    assert sorted(names) == sorted(p.name for p in PRIVATE_NAMES)
    assert len(set(names)) == len(names), "a private name is declared twice"


# --- src/ uses no undeclared private name --------------------------------------------------------
def _own_private_names(files: list[Path]) -> set[str]:
    """Underscore names attnbase defines itself (functions, classes, variables, attributes of
    ``self``/``cls``, parameters, import aliases)."""
    own = set()
    for f in files:
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                own.add(n.id)
            elif isinstance(n, ast.arg):
                own.add(n.arg)
            elif isinstance(n, ast.alias) and n.asname:
                own.add(n.asname)
            elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                  and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                own.add(n.attr)
            elif isinstance(n, ast.keyword) and n.arg:
                own.add(n.arg)
    return {x for x in own if x.startswith("_")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith("_attnbase")


def _dotted_root(node: ast.AST) -> str | None:
    """The first name of ``a.b.c`` (names and attributes only: a call's result is not a
    module's attribute)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


def undeclared(source: str, where: str, own: set[str],
               declared: tuple[PrivateName, ...] = PRIVATE_NAMES) -> list[str]:
    """``where:line: what`` for each private third-party name in ``source`` that ``declared``
    does not list."""
    names = {p.name for p in declared}
    last = {p.name.rpartition(".")[2] for p in declared}

    def known(dotted: str) -> bool:  # declared, or a module on the path of a declared name
        return dotted in names or any(n.startswith(dotted + ".") for n in names)

    def internal(dotted: str) -> bool:
        return any(dotted == p or dotted.startswith(p if p.endswith("_") else p + ".")
                   for p in INTERNAL)

    tree = ast.parse(source)
    third: dict[str, str] = {}  # local name -> dotted third-party origin
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                top = a.name.split(".")[0]
                if top != "attnbase" and top not in sys.stdlib_module_names:
                    third[a.asname or top] = a.name if a.asname else top
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            top = n.module.split(".")[0]
            if top != "attnbase" and top not in sys.stdlib_module_names:
                for a in n.names:
                    third[a.asname or a.name] = f"{n.module}.{a.name}"
    bad = []
    for n in ast.walk(tree):
        hit = None
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            if n.module.split(".")[0] in ("attnbase",) + tuple(sys.stdlib_module_names):
                continue
            for a in n.names:
                dotted = f"{n.module}.{a.name}"
                if ((internal(n.module) or _private(a.name)
                     or any(_private(s) for s in n.module.split(".")))
                        and not known(dotted)):
                    bad.append(f"{where}:{n.lineno}: from {n.module} import {a.name}")
        elif isinstance(n, ast.Import):
            for a in n.names:
                if internal(a.name) and not known(a.name):
                    hit = f"import {a.name}"
        elif isinstance(n, ast.Attribute) and _private(n.attr):
            root = _root(n.value)
            if root in ("self", "cls") or (root in sys.stdlib_module_names and root not in third):
                continue
            if n.attr not in own and n.attr not in last:
                hit = ast.unparse(n)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(n.args) >= 2
              and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
            attr, root = n.args[1].value, _root(n.args[0])
            if _private(attr) and attr not in own and attr not in last:
                hit = ast.unparse(n)
            elif n.func.id in ("setattr", "delattr") and root in third and attr not in last:
                hit = f"{ast.unparse(n)} (patches {third[root]})"
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            if internal(n.value) and " " not in n.value and not known(n.value):
                hit = repr(n.value)
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
            for t in targets:
                root = _dotted_root(t.value) if isinstance(t, ast.Attribute) else None
                if root in third and t.attr not in last:
                    bad.append(f"{where}:{n.lineno}: {ast.unparse(t)} = ... (patches "
                               f"{third[root]})")
        if hit is not None:
            bad.append(f"{where}:{n.lineno}: {hit}")
    return bad


def _src_files() -> list[Path]:
    return sorted(f for f in SRC.rglob("*.py") if f.name != "private_api.py")  # the declarations


def test_src_uses_no_undeclared_private_name():
    files = _src_files()
    own = _own_private_names(files)
    bad = [b for f in files for b in undeclared(f.read_text(), str(f.relative_to(ROOT)), own)]
    assert not bad, ("private names of dependencies not declared in attnbase.private_api "
                     "(declare each with its reason, and list it in docs/toolchain.md): "
                     + "; ".join(bad))


def test_undeclared_private_names_are_found():
    """Negative control of the walk: each kind of private use is reported."""
    own = _own_private_names(_src_files())
    src = '''
import torch
import typer
from typer.core import TyperOption
from uvicorn.protocols.http.h11_impl import H11Protocol
from transformers.models.llama import modeling_llama as ml

x = torch._C._get_tracing_state()
y = getattr(model.config, "_name_or_path", None)
TyperOption.display_type_rich = lambda self, ctx: None
setattr(typer, "echo", print)
MOD = "transformers.models.mistral.modeling_mistral"
'''
    bad = undeclared(src, "control.py", own)
    joined = "\n".join(bad)
    for needle in ("torch._C._get_tracing_state", "_name_or_path", "from typer.core import",
                   "from uvicorn.protocols.http.h11_impl import H11Protocol",
                   "display_type_rich = ... (patches typer.core.TyperOption)",
                   "setattr(typer, 'echo', print)", "modeling_mistral"):
        assert needle in joined, f"{needle!r} not reported:\n{joined}"
    # the declared ones in the same shape pass
    ok = '''
from transformers.models.llama import modeling_llama as ml
MOD = "transformers.models.falcon.modeling_falcon"
impl = getattr(config, "_attn_implementation", None)
'''
    assert undeclared(ok, "control.py", own) == []
    # and the same name, undeclared, is reported
    assert undeclared(ok, "control.py", own, declared=()) != []
