"""Every private name of a dependency attnbase uses, declared once.

A *private name* is one a dependency does not promise to keep: an underscore name, an
attribute of a module its documentation does not list (transformers' modeling modules and
auto mappings, uvicorn's protocol module), a class we subclass or a method we override without
a documented hook. Each is declared here with why we use it and what happens without it; the
same table is in docs/toolchain.md ("Private names of dependencies we use"), and
tests/test_private_api.py resolves every name in the installed versions, checks the table
against :data:`PRIVATE_NAMES` and walks ``src/`` for private names not declared here.

Code that reaches a private name goes through :func:`resolve` (or :func:`read` for an
attribute of an object), so a release that drops one stops the command with one line,
"``NAME is gone in DIST X.Y: see docs/toolchain.md``" (:class:`PrivateNameGoneError`, exit 2),
instead of an ``AttributeError`` traceback.

``optional`` names are used only where the installed version has them (the code reads them
with a fallback): their absence is not an error.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache

from attnbase.errors import AttnbaseError


class PrivateNameGoneError(AttnbaseError):
    """A dependency's private name attnbase relies on is missing from the installed version."""


@dataclass(frozen=True)
class PrivateName:
    """One private name: ``name`` is dotted from the top-level module (attributes after the
    module path are looked up with ``getattr``)."""

    dependency: str  #: the distribution (pip name) that provides it
    name: str
    where: str  #: the modules of src/attnbase that use it
    why: str
    if_gone: str  #: what happens when a release drops it
    optional: bool = False  #: used only where present (read with a fallback)


_TF_RUN = "the command stops with the one-line error"

#: Every private name of a dependency that src/attnbase uses.
PRIVATE_NAMES: tuple[PrivateName, ...] = (
    # --- uvicorn ------------------------------------------------------------------------------
    PrivateName(
        "uvicorn", "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol",
        "serve/deadlines.py",
        "the HTTP protocol the request deadlines (408), head cap (431) and connection cap "
        "(503) wrap, used only through the asyncio.Protocol interface; a 408 before a head is "
        "parsed and a 503 to a silent connection need the connection, which no uvicorn "
        "setting or ASGI middleware sees",
        "attnbase serve does not start (one line)"),
    PrivateName(
        "uvicorn", "uvicorn.Server.startup", "serve/uvicorn_server.py",
        "overridden to print the URL once the socket listens (uvicorn has no ready callback)",
        "attnbase serve does not start (one line)"),
    PrivateName(
        "uvicorn", "uvicorn.Server.handle_exit", "serve/uvicorn_server.py",
        "overridden so SIGINT/SIGTERM interrupt running DuckDB queries at once (uvicorn has no "
        "shutdown-signal callback; lifespan shutdown runs only after requests end)",
        "attnbase serve does not start (one line)"),
    # --- transformers: objects -------------------------------------------------------------
    PrivateName(
        "transformers", "transformers.PretrainedConfig._attn_implementation",
        "extract/capture.py, extract/variants.py, extract/families/generic.py",
        "which attention function a loaded model runs (transformers has a public setter, "
        "set_attn_implementation, but no public getter)",
        _TF_RUN),
    PrivateName(
        "transformers", "transformers.PretrainedConfig._commit_hash", "extract/models.py",
        "the hub revision of a downloaded checkpoint, recorded as the run's model_revision "
        "(an instance attribute from_pretrained sets)",
        "the run records the revision asked for (or 'hub') instead", optional=True),
    # --- transformers: auto mappings -------------------------------------------------------
    PrivateName(
        "transformers", "transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES",
        "extract/registry.py", "every model type the installed transformers knows: the rows "
        "of docs/models.md", "`python -m attnbase.extract.registry` and `attnbase models` stop"),
    PrivateName(
        "transformers",
        "transformers.models.auto.configuration_auto.model_type_to_module_name",
        "extract/families/generic.py", "the modeling file of a model type, read as text without "
        "importing it (is its attention on the interface, is it rotary)", _TF_RUN),
    PrivateName(
        "transformers",
        "transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
        "extract/vision.py", "the ...ForImageClassification class of a vision model type",
        "vision models (tiny-vit) do not load"),
    # --- transformers: modeling modules (the capture reads the real modules) ---------------
    *(PrivateName(
        "transformers", f"transformers.models.{m}.modeling_{m}.eager_attention_forward",
        "extract/attention_call.py", "the family's own eager attention, checked against the "
        "captured logits and matched by source text for families that copy it",
        "the capture falls back to its llama-semantics reference function; a family whose "
        "softmax dtype differs then fails its parity check")
      for m in ("gpt2", "bert", "gpt_neox", "llama", "gemma3")),
    *(PrivateName(
        "transformers", f"transformers.models.{m}.modeling_{m}.apply_rotary_pos_emb",
        "extract/families/generic.py (wrap_rotary), extract/families/falcon.py",
        "wrapped (monkeypatched) to observe pre- and post-RoPE queries and keys",
        "keys are not captured: the capture stops with 'called no apply_rotary_pos_emb'")
      for m in ("gpt_neox", "llama", "gemma3", "falcon")),
    PrivateName(
        "transformers", "transformers.models.bloom.modeling_bloom.build_alibi_tensor",
        "extract/families/bloom.py", "BLOOM's ALiBi slopes as transformers forms them",
        "BLOOM models do not load"),
    PrivateName(
        "transformers",
        "transformers.models.falcon.modeling_falcon.FALCON_ATTENTION_CLASSES",
        "extract/families/falcon.py", "Falcon's attention class by implementation name (up "
        "to transformers 5.24); 5.25 routes Falcon through the attention interface and the "
        "generic capture serves it", "used only where present", optional=True),
    PrivateName(
        "transformers",
        "transformers.models.falcon.modeling_falcon.FalconAttention._split_heads",
        "extract/families/falcon.py", "Falcon's values from its fused projection (the "
        "adapter of transformers up to 5.24)", "used only where present", optional=True),
    # --- prefect -------------------------------------------------------------------------------
    PrivateName(
        "prefect", "prefect.server.api.server.SubprocessASGIServer", "flows/runners.py",
        "the URL of the temporary server get_client() started, handed to Dask workers so "
        "they do not each start one", "flows on a LocalCluster stop (one line)"),
)

_BY_NAME = {p.name: p for p in PRIVATE_NAMES}


def _version(dependency: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dependency)
    except PackageNotFoundError:
        return "(not installed)"


def gone_message(name: str, dependency: str | None = None) -> str:
    """The one line for a private name the installed ``dependency`` lacks."""
    dependency = dependency or (_BY_NAME[name].dependency if name in _BY_NAME
                                else name.split(".")[0])
    return f"{name} is gone in {dependency} {_version(dependency)}: see docs/toolchain.md"


def _declared(name: str) -> PrivateName:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in attnbase.private_api.PRIVATE_NAMES") from None


def lookup(name: str, dependency: str | None = None) -> object:
    """The object at dotted ``name`` (the longest importable module, then attributes), or
    :class:`PrivateNameGoneError` with :func:`gone_message`. Declared or not (the tests'
    negative control resolves an undeclared name)."""
    parts = name.split(".")
    obj, i = None, len(parts)
    while i > 0:
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError:
            i -= 1
        except ImportError:  # a module that exists but fails to import: not "gone"
            raise
    if obj is None:
        raise PrivateNameGoneError(gone_message(name, dependency))
    for attr in parts[i:]:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise PrivateNameGoneError(gone_message(name, dependency)) from None
    return obj


@lru_cache(maxsize=None)
def resolve(name: str) -> object:
    """The declared private ``name`` in the installed version (:func:`lookup`)."""
    return lookup(name, _declared(name).dependency)


_MISSING = object()


def read(obj: object, name: str) -> object:
    """Attribute ``name``'s last part of ``obj`` (an instance of the declared owner), or
    :class:`PrivateNameGoneError`."""
    entry = _declared(name)
    value = getattr(obj, name.rpartition(".")[2], _MISSING)
    if value is _MISSING:
        raise PrivateNameGoneError(gone_message(name, entry.dependency))
    return value


def missing(names: tuple[PrivateName, ...] = PRIVATE_NAMES) -> list[str]:
    """One :func:`gone_message` per required name the installed versions lack."""
    out = []
    for p in names:
        if p.optional:
            continue
        try:
            lookup(p.name, p.dependency)
        except PrivateNameGoneError as err:
            out.append(str(err))
    return out


def table() -> str:
    """The Markdown table of :data:`PRIVATE_NAMES` in docs/toolchain.md (tested equal)."""
    rows = ["| dependency | name | where in src/attnbase | why | if it goes |",
            "|---|---|---|---|---|"]
    for p in PRIVATE_NAMES:
        gone = f"optional: {p.if_gone}" if p.optional else p.if_gone
        rows.append(f"| {p.dependency} | `{p.name}` | {p.where} | {p.why} | {gone} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m attnbase.private_api: the table for docs/toolchain.md
    print(table())
