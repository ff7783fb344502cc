"""Everything a report shows, read from the catalog tables (never from the Zarr arrays).

Reports never compute statistics (docs/architecture.md): this module only selects rows of the catalog
and takes plain means of values the catalog already holds (per-row ``row_stats`` averaged over
rows, per-head ``head_metrics`` averaged over heads). Each such average is named in the caption
of the figure that shows it.

All reads go through :func:`read_catalog`, the one seam to the warehouse's read-only SQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from attnbase.errors import RunNotFoundError

if TYPE_CHECKING:
    from attnbase.warehouse import Database

# Rows with fewer unmasked keys have no content geometry (docs/metrics.md §4: n < 3).
MIN_ROW_KEYS = 3


def read_catalog(db: Database, query: str, params: list[Any] | None = None) -> pl.DataFrame:
    """Run one read-only ``query`` against ``db``'s catalog and return a Polars frame."""
    from attnbase.warehouse import read_sql

    return read_sql(db, query, params)


def catalog_name(db: Database) -> str:
    """How messages name the catalog: a team database's address, else ``DIR/catalog.duckdb``."""
    return db.url or str(db.catalog_path)


def reports_dir(db: Database) -> Path:
    """Where the reports of a database live: ``DIR/reports``, or under a team database's data
    location (where its service serves them from)."""
    return db.require().path / "reports"


@dataclass(frozen=True)
class RunData:
    """The catalog's rows about one run, as the report sections consume them.

    Frames are empty (with their columns) when the table is absent or holds nothing for the run.
    ``row_heads`` / ``row_layers`` are plain means of ``row_stats`` columns over rows with
    ``n_keys >= MIN_ROW_KEYS`` (per (layer, head) and per layer).
    """

    run_id: str
    run: dict[str, Any]
    tables: frozenset[str]
    run_metrics: dict[str, float]
    head_metrics: pl.DataFrame  # layer, head, metric, value
    layer_metrics: pl.DataFrame  # layer, metric, value
    null_tests: pl.DataFrame  # layer, head, metric, null_model, statistic, null_mean, null_sd, z, draws, seed, p_value, p_method, p_empirical, p_at_floor, q_value
    row_heads: pl.DataFrame  # layer, head, n_rows, sink_mass, sink_balance, max_prob, entropy, content_entropy
    row_layers: pl.DataFrame  # layer, n_rows, entropy, sink_part, content_part
    studies: pl.DataFrame  # study_id, kind, params, created_at, key, value
    extra: dict[str, Any] = field(default_factory=dict)

    # --- small selectors used by sections and figures ----------------------------------------
    @property
    def n_layers(self) -> int:
        return int(self.run.get("n_layers") or 0)

    @property
    def n_heads(self) -> int:
        return int(self.run.get("n_heads") or 0)

    def head_metric_names(self) -> set[str]:
        return set(self.head_metrics["metric"].unique().to_list())

    def layer_metric_names(self) -> set[str]:
        return set(self.layer_metrics["metric"].unique().to_list())

    def has_head_metric(self, name: str) -> bool:
        return name in self.head_metric_names()

    def has_layer_metric(self, name: str) -> bool:
        return name in self.layer_metric_names()

    def has_run_metric(self, name: str) -> bool:
        value = self.run_metrics.get(name)
        return value is not None

    def head_matrix(self, metric: str):
        """``head_metrics[metric]`` as a float array [layer, head] (NaN where absent)."""
        import numpy as np

        out = np.full((self.n_layers, self.n_heads), np.nan)
        df = self.head_metrics.filter(pl.col("metric") == metric)
        for layer, head, value in df.select("layer", "head", "value").iter_rows():
            if 0 <= layer < out.shape[0] and 0 <= head < out.shape[1] and value is not None:
                out[layer, head] = value
        return out

    def row_matrix(self, column: str):
        """A ``row_heads`` column as a float array [layer, head] (NaN where absent)."""
        import numpy as np

        out = np.full((self.n_layers, self.n_heads), np.nan)
        for layer, head, value in self.row_heads.select("layer", "head", column).iter_rows():
            if 0 <= layer < out.shape[0] and 0 <= head < out.shape[1] and value is not None:
                out[layer, head] = value
        return out

    def layer_series(self, metric: str):
        """``layer_metrics[metric]`` as a float array [layer] (NaN where absent)."""
        import numpy as np

        out = np.full(self.n_layers, np.nan)
        df = self.layer_metrics.filter(pl.col("metric") == metric)
        for layer, value in df.select("layer", "value").iter_rows():
            if 0 <= layer < out.shape[0] and value is not None:
                out[layer] = value
        return out

    def layer_family(self, prefix: str) -> dict:
        """``{metric: float array [hidden state]}`` of the ``layer_metrics`` rows whose name
        starts with ``prefix`` (``massive_``, ``high_norm_``), as long as the family's deepest
        row (NaN where a state has none); empty where the run has none."""
        import numpy as np

        df = self.layer_metrics.filter(pl.col("metric").str.starts_with(prefix))
        if df.height == 0:
            return {}
        n = int(df["layer"].max()) + 1
        out: dict = {}
        for layer, metric, value in df.select("layer", "metric", "value").iter_rows():
            out.setdefault(metric, np.full(n, np.nan))[layer] = np.nan if value is None else value
        return out

    def nulls(self, metric: str, null: str) -> pl.DataFrame:
        return self.null_tests.filter((pl.col("metric") == metric) & (pl.col("null_model") == null))


_EMPTY = {
    "head_metrics": {"layer": pl.Int64, "head": pl.Int64, "metric": pl.Utf8, "value": pl.Float64},
    "layer_metrics": {"layer": pl.Int64, "metric": pl.Utf8, "value": pl.Float64},
    "null_tests": {
        "layer": pl.Int64, "head": pl.Int64, "metric": pl.Utf8, "null_model": pl.Utf8,
        "statistic": pl.Float64, "null_mean": pl.Float64, "null_sd": pl.Float64,
        "z": pl.Float64, "draws": pl.Int64, "seed": pl.Int64, "p_value": pl.Float64,
        "p_method": pl.Utf8, "p_empirical": pl.Float64, "p_at_floor": pl.Boolean,
        "q_value": pl.Float64,
    },
    "row_heads": {
        "layer": pl.Int64, "head": pl.Int64, "n_rows": pl.Int64, "sink_mass": pl.Float64,
        "sink_balance": pl.Float64, "max_prob": pl.Float64, "entropy": pl.Float64,
        "content_entropy": pl.Float64,
    },
    "row_layers": {
        "layer": pl.Int64, "n_rows": pl.Int64, "entropy": pl.Float64,
        "sink_part": pl.Float64, "content_part": pl.Float64,
    },
    "studies": {
        "study_id": pl.Utf8, "kind": pl.Utf8, "params": pl.Utf8, "key": pl.Utf8,
        "value": pl.Float64,
    },
}


def _empty(name: str) -> pl.DataFrame:
    return pl.DataFrame(schema=_EMPTY[name])


def catalog_tables(db: Database) -> frozenset[str]:
    """Names of the tables and views in the catalog's main schema."""
    df = read_catalog(
        db,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'",
    )
    return frozenset(df["table_name"].to_list())


def known_runs(db: Database) -> list[str]:
    return read_catalog(db, "SELECT run_id FROM runs ORDER BY run_id")["run_id"].to_list()


def _id_tokens(run_ids: str | None) -> set[str]:
    import re

    return set(re.findall(r"[^\s\[\]\"',]+", run_ids or ""))


def require_runs(db: Database, run_ids: tuple[str, ...] | list[str]) -> None:
    """:class:`RunNotFoundError` (one line, listing the known runs) unless every id exists."""
    db.require()
    if "runs" not in catalog_tables(db):
        raise RunNotFoundError(
            f"run {run_ids[0]!r} not found: the catalog at {catalog_name(db)} has no "
            "runs table yet; extract a run first with `attnbase extract`"
        )
    known = known_runs(db)
    for run_id in run_ids:
        if run_id not in known:
            shown = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "") if known else "none"
            raise RunNotFoundError(
                f"run {run_id!r} not found in {catalog_name(db)} (known runs: "
                f"{shown}); list them with `attnbase runs --db {db.name}`"
            )


def load_run(db: Database, run_id: str) -> RunData:
    """Read every catalog row about ``run_id``; :class:`RunNotFoundError` for an unknown run."""
    require_runs(db, [run_id])
    tables = catalog_tables(db)
    runs = read_catalog(db, "SELECT * FROM runs WHERE run_id = ?", [run_id])
    run = runs.row(0, named=True)

    def select(table: str, columns: str, order: str) -> pl.DataFrame | None:
        if table not in tables:
            return None
        return read_catalog(
            db, f"SELECT {columns} FROM {table} WHERE run_id = ? ORDER BY {order}", [run_id]
        )

    head = select("head_metrics", "layer, head, metric, value", "metric, layer, head")
    layer = select("layer_metrics", "layer, metric, value", "metric, layer")
    nulls = select(
        "null_tests",
        "layer, head, metric, null_model, statistic, null_mean, null_sd, z, draws, seed, "
        "p_value, p_method, p_empirical, p_at_floor, q_value",
        "metric, null_model, layer, head",
    )
    rm = select("run_metrics", "metric, value", "metric")
    run_metrics = (
        {m: (None if v is None else float(v)) for m, v in rm.iter_rows()} if rm is not None else {}
    )

    row_heads = row_layers = None
    if "row_stats" in tables:
        # Plain means over rows; H_b(s) is the binary entropy of the stored sink mass (nats), so
        # that H(p) = H_b(s) + (1 - s) H(pi) (docs/metrics.md §4) can be shown term by term.
        row_heads = read_catalog(
            db,
            f"""SELECT layer, head, count(*) AS n_rows, avg(sink_mass) AS sink_mass,
                       avg(sink_balance) AS sink_balance, avg(max_prob) AS max_prob,
                       avg(entropy) AS entropy, avg(content_entropy) AS content_entropy
                FROM row_stats WHERE run_id = ? AND n_keys >= {MIN_ROW_KEYS}
                GROUP BY layer, head ORDER BY layer, head""",
            [run_id],
        )
        row_layers = read_catalog(
            db,
            f"""SELECT layer, count(*) AS n_rows, avg(entropy) AS entropy,
                       avg(CASE WHEN sink_mass <= 0 OR sink_mass >= 1 THEN 0.0
                                ELSE -sink_mass * ln(sink_mass)
                                     - (1 - sink_mass) * ln(1 - sink_mass) END) AS sink_part,
                       avg((1 - sink_mass) * content_entropy) AS content_part
                FROM row_stats
                WHERE run_id = ? AND n_keys >= {MIN_ROW_KEYS} AND content_entropy IS NOT NULL
                      AND NOT isnan(content_entropy)
                GROUP BY layer ORDER BY layer""",
            [run_id],
        )

    studies = None
    if {"studies", "study_results"} <= tables:
        all_studies = read_catalog(
            db,
            """SELECT s.study_id, s.kind, CAST(s.run_ids AS VARCHAR) AS run_ids,
                      CAST(s.params AS VARCHAR) AS params,
                      r.key, TRY_CAST(r.value AS DOUBLE) AS value
               FROM studies s JOIN study_results r USING (study_id)
               ORDER BY s.kind, s.study_id, r.key""",
        )
        # run_ids may be a list column or a JSON/comma-separated string: match the id as a token.
        mask = [run_id in _id_tokens(ids) for ids in all_studies["run_ids"].to_list()]
        studies = all_studies.filter(pl.Series(mask, dtype=pl.Boolean)).drop("run_ids")

    def or_empty(df: pl.DataFrame | None, name: str) -> pl.DataFrame:
        if df is None or df.height == 0:
            return _empty(name)
        return df.cast({k: v for k, v in _EMPTY[name].items() if k in df.columns}, strict=False)

    return RunData(
        run_id=run_id,
        run=run,
        tables=tables,
        run_metrics=run_metrics,
        head_metrics=or_empty(head, "head_metrics"),
        layer_metrics=or_empty(layer, "layer_metrics"),
        null_tests=or_empty(nulls, "null_tests"),
        row_heads=or_empty(row_heads, "row_heads"),
        row_layers=or_empty(row_layers, "row_layers"),
        studies=or_empty(studies, "studies"),
    )
