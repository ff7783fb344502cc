"""The ``attnbase`` command: assembles the sub-commands of ``attnbase.commands``.

Every :class:`~attnbase.errors.AttnbaseError` is printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

import typer

from attnbase.errors import AttnbaseError

# No forced offline mode: hub ids (with --revision) work when the network is there, and without it
# extract.models fails fast (hub_reachable) instead of huggingface_hub's ~48 s of retries.
# The Makefile, the tests and `attnbase demo` still set HF_HUB_OFFLINE=1.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="attnbase: an activation database for attention research.")

def _print_version(value: bool) -> None:
    if value:
        from attnbase import __version__

        typer.echo(f"attnbase {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    """attnbase: an activation database for attention research."""


COMMAND_MODULES = ("extract", "runs", "sql", "analyze", "report", "flow", "demo", "study",
                   "weights", "verify")

for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"attnbase.commands.{_name}")
    except ModuleNotFoundError as exc:  # a stage not built yet in this checkout
        if exc.name != f"attnbase.commands.{_name}":
            raise
        continue
    _mod.register(app)


#: ``gc.set_threshold`` of the command: CPython's defaults (700, 10) for the young generations,
#: a full collection after 1000 (not 10) collections of generation 1.
GC_THRESHOLDS = (700, 10, 1000)


def main() -> None:
    """Console-script entry point (``attnbase = "attnbase.cli:main"``).

    Typer runs in standalone mode, so usage errors, ``--help`` and Ctrl-C are handled by its
    click layer (typer vendors click: catching ``click.ClickException`` would miss them). Our own
    errors propagate out of it and are printed here as one line.

    Garbage collection: importing torch and transformers creates a few million long-lived objects,
    and every full (generation-2) collection scans them all again. Full collections are made 100x
    rarer (:data:`GC_THRESHOLDS`; the young generations collect as usual), and at exit the heap
    is frozen so that interpreter teardown does not scan it once more. Measured on a 2-core CPU:
    -0.45 s on importing torch + transformers' modeling code, -0.8 s at exit (benchmarks/RESULTS.md).
    """
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        app()
    except AttnbaseError as err:
        msg = " ".join(str(err).split("\n"))
        typer.echo(f"{err.prefix}{msg}", err=True)
        sys.exit(err.exit_code)
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()
