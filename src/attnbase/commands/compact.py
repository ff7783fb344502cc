"""``attnbase compact``: drop a run's stored attention logits where queries and keys reproduce them."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database


def _recipe(info: dict):
    """The logits recipe of the run's model: its config and attention modules, loaded the way
    ``attnbase extract`` loads them (weights included: the scales are module attributes)."""
    from attnbase.errors import WarehouseError
    from attnbase.extract import load_model

    if info["dtype"] != "float32":
        raise WarehouseError(f"run {info['run_id']!r} ran in {info['dtype']}: its logits were "
                             "formed in that dtype and cannot be derived from float32 queries "
                             "and keys, so they stay stored")
    lm = load_model(info["model"], dtype="float32", device="cpu")
    recipe = lm.info.logits_recipe
    if recipe is None or lm.info.family != info["family"]:
        raise WarehouseError(f"model {info['model']!r} (family {lm.info.family!r}) declares no "
                             "logits recipe; the run's logits stay stored")
    return recipe


def register(app: typer.Typer) -> None:
    @app.command("compact")
    def compact(
        db: str = db_option(),
        run: str = typer.Option(..., "--run", "-r", help="run to compact"),
        stats_only: bool = typer.Option(False, "--stats-only",
                                        help="only merge the statistics files; logits untouched"),
        wait: bool = typer.Option(False, "--wait", help="wait for another process writing this "
                                  "run to finish (default: refuse, naming it)"),
    ) -> None:
        """Make a finished run compact: drop its stored attn_logits after checking, chunk by
        chunk, that its queries and keys reproduce them (readers then form them on access), and
        merge its row_stats/col_stats files into one per table, sorted by layer and head (a
        question about one head then reads one row group). Prints what it freed and merged."""
        from attnbase.warehouse.runs.compact import already_derived, compact_run
        from attnbase.warehouse.runs.statcompact import compact_stats

        database = open_database(db)
        info = database.run_info(run)
        did = False
        has_logits = any(r["name"] == "attn_logits" for r in database.array_rows(run))
        if has_logits and not stats_only:
            # a derived run needs no model: only a stopped compaction's leftovers can remain
            recipe = None if already_derived(database, run) else _recipe(info)
            res = compact_run(database, run, recipe, wait=wait)
            if res.chunks_compared:
                typer.echo(f"{run}: attn_logits now derived from queries and keys "
                           f"({res.chunks_compared} chunks compared, max abs difference "
                           f"{res.max_abs_diff:.3g}, max relative {res.max_rel_diff:.3g}); "
                           f"{res.bytes_freed / 2**20:.1f} MiB freed")
                did = True
            elif res.bytes_freed:
                typer.echo(f"{run}: attn_logits already derived; {res.bytes_freed / 2**20:.1f} "
                           "MiB left by a stopped compaction freed")
                did = True
        st = compact_stats(database, run, wait=wait)
        if st.partials_removed:
            typer.echo(f"{run}: removed {len(st.partials_removed)} file(s) a stopped write left "
                       f"(never read): {', '.join(st.partials_removed)}")
        if st.files_after < st.files_before:
            typer.echo(f"{run}: row_stats/col_stats merged, {st.files_before} files -> "
                       f"{st.files_after} ({st.rows:,} row_stats rows sorted by layer and head, "
                       f"row groups of {st.group_rows:,} rows"
                       f"{' = a row group per head' if st.head_groups else ''}; {st.note}) in "
                       f"{st.seconds:.1f} s")
            did = True
        elif st.note:
            typer.echo(f"{run}: statistics files not merged: {st.note}")
        if not did:
            typer.echo(f"{run}: nothing to compact (attn_logits "
                       f"{'derived or absent' if not stats_only else 'not looked at'}, "
                       "statistics files merged already)")
