"""The ``attnbase`` command: assembles the sub-commands of ``attnbase.commands``.

Every :class:`~attnbase.errors.AttnbaseError` is printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys

import typer

from attnbase.errors import AttnbaseError

# No forced offline mode: hub ids (with --revision) work when the network is there, and without it
# extract.models fails fast (hub_reachable) instead of waiting out huggingface_hub's retries.
# The Makefile, the tests and `attnbase demo` still set HF_HUB_OFFLINE=1.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


#: ``rich_markup_mode=None``: click's plain help. Typer's rich panels print ``<bool>`` beside
#: every flag (a flag takes no value) and cut long help words ("http://127.0.0.1:4200/a…");
#: the plain help shows the same options, defaults, ranges and env vars without either, with
#: no patch of typer's private ``TyperOption.display_type_rich`` (docs/toolchain.md).
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="attnbase: an activation database for attention research.")

def _print_version(value: bool) -> None:
    if value:
        from attnbase._version import __version__

        typer.echo(f"attnbase {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
    verbose: bool = typer.Option(False, "--verbose",
                                 help="also show third-party progress bars (transformers) and "
                                      "Prefect's INFO logs"),
) -> None:
    """attnbase: an activation database for attention research."""
    from attnbase._quiet import quiet_third_party

    quiet_third_party(verbose)


COMMAND_MODULES = ("init", "extract", "runs", "sql", "analyze", "report", "flow", "demo", "study",
                   "weights", "verify", "compact", "serve", "token", "models", "catalog", "sinks",
                   "worker")

for _name in COMMAND_MODULES:
    importlib.import_module(f"attnbase.commands.{_name}").register(app)


#: glibc ``mallopt`` of the command: blocks up to 32 MiB come from the heap, not from a fresh
#: ``mmap`` each time, and freed heap memory is kept for the next batch, not handed back to the
#: kernel (which would fault it in again, zeroed). Without them a forward's activations (a few
#: MB each) are mapped and unmapped on every call, each time faulted in afresh
#: (benchmarks/RESULTS.md: "glibc mallopt of the command").
MALLOC_OPTIONS = {-3: 32 << 20,  # M_MMAP_THRESHOLD (its maximum on 64-bit glibc)
                  -1: 1 << 30}   # M_TRIM_THRESHOLD


def _steady_heap() -> bool:
    """Apply :data:`MALLOC_OPTIONS` where the C library is glibc (elsewhere: nothing)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in MALLOC_OPTIONS.items())


#: ``gc.set_threshold`` of the command: CPython's defaults (700, 10) for the young generations,
#: a full collection after 1000 (not 10) collections of generation 1.
GC_THRESHOLDS = (700, 10, 1000)
_EXIT_FREEZE = False


def _one_line(err: AttnbaseError) -> None:
    msg = " ".join(str(err).split("\n"))
    typer.echo(f"{err.prefix}{msg}", err=True)
    sys.exit(err.exit_code)


#: errno -> what to do, for the OS refusals a command meets writing its outputs.
_UNWRITABLE = {"EACCES": "choose a directory you can write, or fix its permissions",
               "EPERM": "choose a directory you can write, or fix its permissions",
               "EROFS": "choose a directory on a writable file system",
               "ENOSPC": "the disk is full: free some space and run the command again",
               "EDQUOT": "the disk quota is used up: free some space and run the command again"}


def _unwritable(err: OSError) -> AttnbaseError | None:
    """One line for a permission, read-only or full-disk refusal (naming the path and what
    to do), else None."""
    import errno

    name = errno.errorcode.get(err.errno or -1, "")
    if name not in _UNWRITABLE:
        return None
    where = f" {err.filename}" if err.filename else ""
    return AttnbaseError(f"{err.strerror or name}:{where}; {_UNWRITABLE[name]}")


def main() -> None:
    """Console-script entry point (``attnbase = "attnbase.cli:main"``).

    Typer runs in standalone mode, so usage errors, ``--help`` and Ctrl-C are handled by its
    click layer (typer vendors click: catching ``click.ClickException`` would miss them). Our own
    errors propagate out of it and are printed here as one line.

    Garbage collection: importing torch and transformers creates a few million long-lived objects,
    and every full (generation-2) collection scans them all again. Full collections are made 100x
    rarer (:data:`GC_THRESHOLDS`; the young generations collect as usual) while the command runs,
    and at process exit (``atexit``) the heap is frozen so that interpreter teardown does not scan
    it once more (benchmarks/RESULTS.md: "CLI garbage-collection thresholds").
    Memory: glibc's allocator keeps batch-sized blocks in the heap (:data:`MALLOC_OPTIONS`).
    """
    global _EXIT_FREEZE
    if not _EXIT_FREEZE:  # once per process; in-process callers (tests) keep their heap unfrozen
        atexit.register(gc.freeze)
        _EXIT_FREEZE = True
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    _steady_heap()
    from attnbase.interrupt import handle_ctrl_c

    try:
        with handle_ctrl_c():
            app()
    except AttnbaseError as err:
        _one_line(err)
    except ModuleNotFoundError as err:  # an optional dependency this install lacks
        from attnbase.extras import missing_extra

        command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
        lacking = missing_extra(err, command)
        if lacking is None:
            raise
        _one_line(lacking)
    except OSError as err:
        refused = _unwritable(err)
        if refused is None:
            raise
        _one_line(refused)
    except Exception as err:  # a reader's failure on a damaged statistics file: one line
        from attnbase.warehouse.catalog.statledger import damaged_file_error

        damaged = damaged_file_error(err)
        if damaged is None:
            raise
        typer.echo(f"{damaged.prefix}{damaged}", err=True)
        sys.exit(damaged.exit_code)
    finally:
        gc.set_threshold(*before)


if __name__ == "__main__":
    main()
