"""One error hierarchy for the whole package.

Every error carries a one-line message that names the offending thing (model, corpus, run,
array, chunk) and says how to fix it. The CLI prints ``str(err)`` on one line and exits 2.
"""

from __future__ import annotations


class AttnbaseError(Exception):
    """Base of every error attnbase raises on purpose."""

    exit_code = 2
    prefix = "error: "  # how the CLI introduces the one-line message


# --- extract ---------------------------------------------------------------------------------
class ExtractError(AttnbaseError):
    """Problems with models, tokenizers or corpora."""


class UnknownModelError(ExtractError):
    """A model argument that is neither an alias, a local directory, nor reachable on the hub."""


class UnsupportedArchitectureError(ExtractError):
    """A model whose HF ``model_type`` has no registered family adapter."""


class PackagedModelError(UnknownModelError):
    """A model alias whose installed package is missing, incomplete or fails its checksum."""


class HubUnreachableError(UnknownModelError):
    """A hub id asked for while the Hugging Face hub cannot be reached (or offline mode is set)."""


class CorpusError(ExtractError):
    """An unreadable, empty or too-short corpus."""


class NonFiniteActivationError(ExtractError):
    """NaN or inf where a finite activation is required."""


class ExtractInterrupted(AttnbaseError):
    """Ctrl-C during an extraction: the run is marked 'interrupted' and resumes when rerun.

    Not an error of the input: the CLI prints the message without the ``error:`` prefix and
    exits 130 (128 + SIGINT), as shells expect of an interrupted command."""

    exit_code = 130
    prefix = ""


# --- warehouse -------------------------------------------------------------------------------
class WarehouseError(AttnbaseError):
    """Problems with the on-disk database (catalog or run stores)."""


class RunNotFoundError(WarehouseError):
    """A run id that the catalog does not know."""


class RunConfigConflictError(WarehouseError):
    """A run name that already exists with a different configuration."""


class RunBusyError(WarehouseError):
    """A run that another live process is writing (its lease, ``warehouse/catalog/lease.py``)."""


class ArrayCorruptError(WarehouseError):
    """A chunk whose checksum or decoding fails."""


class StatsFileCorruptError(WarehouseError):
    """A statistics file (``row_stats``/``col_stats``) that cannot be read or fails its checksum."""


class CatalogCorruptError(WarehouseError):
    """A block of the catalog file that fails DuckDB's checksum."""


class CatalogLockedError(WarehouseError):
    """The catalog file is held by another process."""


class StorageUnavailableError(WarehouseError):
    """The object store of a run (``s3://``) did not answer within its bounded retries."""


class ReadOnlyViolationError(WarehouseError):
    """A statement given to the read-only SQL interface that would change something."""


class QueryLimitError(WarehouseError):
    """A query stopped at one of its limits (time, rows, bytes); the message names the limit."""


class QueryInterrupted(AttnbaseError):
    """Ctrl-C during a query: it was stopped. Printed without ``error:``, exit 130 (128 + SIGINT)."""

    exit_code = 130
    prefix = ""


# --- stats -----------------------------------------------------------------------------------
class StatsError(AttnbaseError):
    """A statistic asked of data that cannot support it."""


# --- reports ---------------------------------------------------------------------------------
class ReportError(AttnbaseError):
    """A report asked of a run whose data cannot support one (e.g. a failed extraction)."""


# --- serve -----------------------------------------------------------------------------------
class NotFoundError(AttnbaseError):
    """An unknown run, layer, head, sequence, convention or file asked of the service (404);
    the message names the valid range."""


class AuthError(AttnbaseError):
    """A missing, wrong, revoked or expired API token (401), or a token command's bad input."""


# --- install ---------------------------------------------------------------------------------
class MissingExtraError(AttnbaseError):
    """A command or reader that needs an optional dependency the install does not have: the
    message names the extra that brings it (``pip install 'attnbase[EXTRA]'``)."""
