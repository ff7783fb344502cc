"""``attnbase study <kind>``: studies over one or more runs, each stored as a row of ``studies``.

Each kind lives in its own module ``attnbase.commands.study_<name>`` with a
``register(study_app: typer.Typer)`` function; list it in :data:`STUDY_MODULES`. A module that is
not in this checkout yet is skipped.
"""

from __future__ import annotations

import importlib

import typer

#: Modules that add subcommands to ``attnbase study``.
STUDY_MODULES: tuple[str, ...] = ("study_compositional", "study_paths", "study_conventions",
                                  "study_scaling")

study_app = typer.Typer(no_args_is_help=True,
                        help="Studies over runs: distances, reversal, clusters, prune, entropy, paths.")


def register(app: typer.Typer) -> None:
    for name in STUDY_MODULES:
        try:
            mod = importlib.import_module(f"attnbase.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"attnbase.commands.{name}":
                raise
            continue
        mod.register(study_app)
    if study_app.registered_commands or study_app.registered_groups:
        app.add_typer(study_app, name="study")
