"""The published Table 1 of "All Routes Lead to Collapse" as reference data (docs/metrics.md §3a).

The nine rows ship with the package (``attnbase/data/published_table1.csv``, the values exactly as
the paper prints them); the catalog view ``published_table1`` (stats migration 140), ``attnbase
table1 --published`` and the report's paper section all read them through :func:`published_rows`.
It lives in the warehouse (reference data beside the catalog, no statistic computed) so that the
reports, which import no stats module, format the same rows the same way.

Conventions of the published rows (docs/metrics.md §3a): 150 sequences x 128 tokens of WikiText-103
validation, fp32, norm-CV pooled with token 0, ``max_share`` the column share over every query,
r over (layer, head) pairs; the GPT-2 tokenizer adds no BOS, so position 0 is a text token there.
"""

from __future__ import annotations

import csv
import io
from functools import lru_cache
from importlib import resources

from attnbase.formatting import fmt
from attnbase.metrics import N

#: Column -> (SQL type, printed decimals or None). The CSV holds exactly these columns, in order.
COLUMNS: dict[str, tuple[str, int | None]] = {
    "model": ("VARCHAR", None),
    "hub_id": ("VARCHAR", None),
    "n_layers": ("INTEGER", None),
    "d_head": ("INTEGER", None),
    N.key_norm_cv: ("DOUBLE", 3),
    N.ve_at_8: ("DOUBLE", 3),
    N.ve_gauss: ("DOUBLE", 3),
    N.ve_shuffle: ("DOUBLE", 3),
    N.onset_layer: ("INTEGER", None),
    "onset_percent": ("INTEGER", None),  # as printed: round(100 * onset_layer / n_layers)
    N.r_cv_share: ("DOUBLE", 2),
    "r_cv_share_p_ge_05": ("BOOLEAN", None),  # the paper's dagger: p >= 0.05
}
#: The printed columns of the paper's table (label, our metric name), in its order.
PRINTED = (("norm-CV", N.key_norm_cv), ("VE@8", N.ve_at_8), ("Gauss", N.ve_gauss),
           ("shuffle", N.ve_shuffle), ("onset", "onset"), ("r_cv,sh", N.r_cv_share))
#: Published rows shown beside every causal run as context (other models than the run's).
CONTEXT_HUB_IDS = ("openai-community/gpt2", "EleutherAI/pythia-160m")
#: The dagger of the paper's r column (p >= 0.05).
DAGGER = "†"
SOURCE = "All Routes Lead to Collapse, Table 1 (docs/metrics.md §3a)"
CONVENTIONS = ("WikiText-103 validation, 150 x 128 tokens, fp32; GPT-2's tokenizer adds no BOS "
               "(position 0 is a text token)")


def _parse(name: str, text: str):
    sql_type = COLUMNS[name][0]
    if sql_type == "INTEGER":
        return int(text)
    if sql_type == "DOUBLE":
        return float(text)
    if sql_type == "BOOLEAN":
        if text not in ("true", "false"):
            raise ValueError(f"published_table1.csv: {name} must be true or false, got {text!r}")
        return text == "true"
    return text


@lru_cache(maxsize=1)
def _rows() -> tuple[tuple, ...]:
    text = resources.files("attnbase").joinpath("data/published_table1.csv").read_text("utf-8")
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != tuple(COLUMNS):
        raise ValueError(f"published_table1.csv has columns {reader.fieldnames}; "
                         f"expected {list(COLUMNS)}")
    return tuple(tuple(_parse(k, rec[k]) for k in COLUMNS) for rec in reader)


def published_rows() -> list[dict]:
    """The nine published rows, in the paper's order (dicts keyed by :data:`COLUMNS`), with
    ``onset_depth`` = onset_layer / n_layers added."""
    out = []
    for values in _rows():
        row = dict(zip(COLUMNS, values))
        row[N.onset_depth] = row[N.onset_layer] / row["n_layers"]
        out.append(row)
    return out


def _sql_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def published_view_sql() -> str:
    """``CREATE OR REPLACE VIEW published_table1``: the packaged rows as a VALUES list (the view
    needs no file at query time), ``onset_depth`` computed, the source named in every row."""
    cols = ", ".join(COLUMNS)
    values = ",\n    ".join("(" + ", ".join(_sql_literal(v) for v in r) + ")" for r in _rows())
    typed = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, (t, _) in COLUMNS.items())
    return (f"CREATE OR REPLACE VIEW published_table1 AS\n"
            f"SELECT {typed},\n"
            f"       CAST(onset_layer AS DOUBLE) / n_layers AS onset_depth,\n"
            f"       {_sql_literal(SOURCE)} AS source\n"
            f"FROM (VALUES\n    {values}) AS t({cols})")


def create_published_view(con) -> None:
    """The stats migration's step: (re)create ``published_table1``."""
    con.execute(published_view_sql())


def _hub_key(model: str) -> str:
    return model.split("@", 1)[0].strip().rstrip("/").lower()


def match_published(model: str | None) -> dict | None:
    """The published row of ``model`` (a hub id, optionally ``@revision``; the legacy unprefixed
    GPT-2 names ``gpt2``, ``gpt2-medium``, ... count), or None for any other model."""
    if not model:
        return None
    key = _hub_key(model)
    for row in published_rows():
        hub = row["hub_id"].lower()
        if key == hub or ("/" not in key and hub.startswith("openai-community/")
                          and key == hub.split("/", 1)[1]):
            return row
    return None


def context_rows(model: str | None) -> list[dict]:
    """The :data:`CONTEXT_HUB_IDS` rows other than ``model``'s own."""
    own = match_published(model)
    return [r for r in published_rows() if r["hub_id"] in CONTEXT_HUB_IDS
            and (own is None or r["hub_id"] != own["hub_id"])]


def position0_published(row: dict) -> str:
    """What position 0 is in a published row: the paper states it for GPT-2 only."""
    return "text (no BOS)" if row["hub_id"].startswith("openai-community/") else "not stated"


def printed_cell(name: str, value, *, p_value=None, n_layers=None, flag=None) -> str:
    """A cell the way the paper prints its column ``name`` (:data:`PRINTED`): the column's
    decimals (:data:`COLUMNS`; :func:`attnbase.formatting.fmt`, fixed style), r with the dagger
    where p >= 0.05 (``flag``, or ``p_value`` when given), onset as ``L{layer} ({percent}%)`` or
    "none" where no layer exceeds the threshold; "-" for a missing value."""
    if value is None or (isinstance(value, float) and value != value):
        return fmt(None, style="fixed")
    if name == "onset":
        layer, pct = value
        if layer is None:
            return "none"  # no layer's mean max share exceeds the threshold
        if pct is None:
            pct = round(100 * layer / n_layers)
        return f"L{int(layer)} ({int(pct)}%)"
    text = fmt(value, COLUMNS[name][1], style="fixed")
    if name == N.r_cv_share:
        dagger = flag if flag is not None else (p_value is not None and p_value >= 0.05)
        if dagger:
            text += DAGGER
    return text


def printed_row(row: dict) -> list[str]:
    """A published row's printed cells, in :data:`PRINTED` order."""
    cells = []
    for _, name in PRINTED:
        if name == "onset":
            cells.append(printed_cell("onset", (row[N.onset_layer], row["onset_percent"])))
        elif name == N.r_cv_share:
            cells.append(printed_cell(name, row[name], flag=row["r_cv_share_p_ge_05"]))
        else:
            cells.append(printed_cell(name, row[name]))
    return cells


def printed_run_row(metrics: dict) -> list[str]:
    """A run's Table-1 metrics (``table1`` view / run_metrics names) printed as the paper does."""
    cells = []
    for _, name in PRINTED:
        if name == "onset":
            layer = metrics.get(N.onset_layer)
            cells.append(printed_cell("onset", (None if layer is None else int(layer), None),
                                     n_layers=metrics.get("n_layers")))
        elif name == N.r_cv_share:
            cells.append(printed_cell(name, metrics.get(name), p_value=metrics.get(N.r_cv_share_p)))
        else:
            cells.append(printed_cell(name, metrics.get(name)))
    return cells
