"""Report sections beside the paper: its published Table 1 and r under its conventions.

* ``paper`` (after ``table1``): the run's Table-1 row printed as the paper prints its own; for a
  run of one of the nine published models (by hub id) the published row and the differences;
  for every causal run the published GPT-2 small and Pythia 160M rows, labelled as other models.
* ``r_conventions``: the latest ``attnbase study r-conventions`` of the run, one line per
  combination (norm-CV variant x share variant x pairing).

Values come from the catalog (run_metrics, studies) and the packaged published rows
(:mod:`attnbase.warehouse.published`); the only arithmetic is the run-minus-paper difference.
"""

from __future__ import annotations

import json
import math

from attnbase.formatting import fmt, fmt_p
from attnbase.metrics import N
from attnbase.reports.blocks import Block, Context, Note, Section, Table, register_section
from attnbase.warehouse.published import (
    COLUMNS, CONVENTIONS, DAGGER, PRINTED, SOURCE, context_rows, match_published,
    position0_published, printed_row, printed_run_row,
)

#: The study kind ``attnbase study r-conventions`` writes (stats/r_conventions.py); its
#: study_results keys are ``<cv>|<share>|<pairing>:<statistic>``.
KIND = "r_conventions"


def split_key(key: str) -> tuple[str, str, str, str]:
    combo, stat = key.rsplit(":", 1)
    cv, share, pairing = combo.split("|")
    return cv, share, pairing, stat

_HEADERS = ["row", "model", "L", "d_h", *(label for label, _ in PRINTED), "position 0", "corpus"]


def _run_metrics(ctx: Context) -> dict:
    r = ctx.run
    return {**r.run_metrics, "n_layers": r.run.get("n_layers"), "d_head": r.run.get("d_head")}


def _diff(run: dict, pub: dict) -> list[str]:
    cells = []
    for _, name in PRINTED:
        if name == "onset":
            ours = run.get(N.onset_layer)
            cells.append(fmt(None, style="fixed") if ours is None else
                         f"{fmt(int(ours) - pub[N.onset_layer], 0, signed=True)} layers")
            continue
        ours = run.get(name)  # missing or NaN: "-"; else with the column's printed decimals
        cells.append(fmt(None if ours is None else float(ours) - pub[name], COLUMNS[name][1],
                         signed=True, style="fixed"))
    return cells


def _has_paper(ctx: Context) -> bool:
    r = ctx.run
    if not r.has_run_metric(N.r_cv_share):
        return False
    return bool(r.run.get("causal")) or match_published(r.run.get("model")) is not None


def _paper(ctx: Context) -> list[Block]:
    r = ctx.run
    model = r.run.get("model")
    run = _run_metrics(ctx)
    rows = [[f"this run ({r.run_id})", str(model), str(r.run.get("n_layers")),
             str(r.run.get("d_head")), *printed_run_row(run), r.run.get("sink_token") or "-",
             str(r.run.get("corpus"))]]
    own = match_published(model)
    if own is not None:
        rows.append(["paper: this model", own["model"], str(own["n_layers"]), str(own["d_head"]),
                     *printed_row(own), position0_published(own), "WikiText-103 val"])
        rows.append(["difference (run - paper)", "", "", "", *_diff(run, own), "", ""])
    if r.run.get("causal"):
        for pub in context_rows(model):
            rows.append([f"paper: other model ({pub['model']})", pub["hub_id"],
                         str(pub["n_layers"]), str(pub["d_head"]), *printed_row(pub),
                         position0_published(pub), "WikiText-103 val"])
    caption = (f"Published rows: {SOURCE}; {CONVENTIONS}. This run: position 0 is "
               f"{r.run.get('sink_token') or 'not recorded'!s} (runs.sink_token), "
               f"{r.run.get('n_seqs')} x {r.run.get('seq_len')} tokens of its corpus, "
               f"{r.run.get('dtype')}; norm-CV with token 0, max share over every query and key, "
               f"each query head paired with its kv head's CV (§1, §3). Printed as the paper "
               f"prints: 3 decimals, r with 2, {DAGGER} where p >= 0.05. Rows marked other model "
               "are context, not this run's model.")
    blocks: list[Block] = [Table(_HEADERS, rows, caption=caption)]
    if own is None:
        blocks.append(Note(f"{model} is not one of the paper's nine models; the published rows "
                           "shown are other models, for context only"))
    return blocks


def _study_rows(ctx: Context):
    st = ctx.run.studies
    if st.height == 0 or "kind" not in st.columns:
        return None
    st = st.filter(st["kind"] == KIND)
    if st.height == 0:
        return None
    first = sorted(set(st["study_id"].to_list()))[0]  # several: each differs in its params
    return st.filter(st["study_id"] == first)


def _has_r_conventions(ctx: Context) -> bool:
    return _study_rows(ctx) is not None


def _r_conventions(ctx: Context) -> list[Block]:
    df = _study_rows(ctx)
    table: dict[tuple, dict] = {}
    for key, value in zip(df["key"], df["value"]):
        cv, share, pairing, stat = split_key(key)
        table.setdefault((cv, share, pairing), {})[stat] = value
    params = json.loads(df["params"][0] or "{}")
    default = tuple(str(params.get("default_combination", "")).split("|"))
    rows = []
    for combo, s in sorted(table.items()):
        mark = " (default: r_cv_share)" if combo == default else ""
        rows.append([combo[0], combo[1] + mark, combo[2], str(int(s.get("n", 0))),
                     fmt(s.get("r"), 3, signed=True),
                     f"[{fmt(s.get('ci_low'), 3, signed=True)}, "
                     f"{fmt(s.get('ci_high'), 3, signed=True)}]",
                     fmt_p(s.get("p")), fmt(s.get("spearman"), 3, signed=True)])
    signs = {math.copysign(1, s["r"]) for s in table.values() if s.get("r") is not None
             and not math.isnan(s["r"])}
    r = ctx.run.run
    caption = (f"r(key-norm CV, share) of this run under every convention (study "
               f"{df['study_id'][0]}; position 0: {r.get('sink_token') or '—'}). norm-CV with or "
               "without token 0 (§1); share: column share over every key and query (max_share), "
               "over keys j ≥ 1 without renormalising (excl_sink), over queries i ≥ 4 (q4), both, "
               "or the mean row maximum of queries i ≥ 4 (§3); pairing: each query head with its "
               "kv head's CV, or (GQA) each kv head with the mean share of its query heads. "
               "Pearson r with its two-sided p, 95% BCa bootstrap CI over (layer, head) pairs, "
               "Spearman ρ. The BOS convention is the run's own (compare a --bos none run).")
    blocks: list[Block] = [Table(["norm-CV", "share", "pairing", "n", "r", "95% CI", "p",
                                  "Spearman"], rows, caption=caption, keys=3)]
    blocks.append(Note("every combination gives r of the same sign" if len(signs) == 1 else
                       "the sign of r depends on the convention: compare the rows above"))
    n = ctx.run.studies.filter(ctx.run.studies["kind"] == KIND)["study_id"].n_unique()
    if n > 1:
        blocks.append(Note(f"{n} r-conventions studies of this run (other seeds or --min-query); "
                           f"this table shows {df['study_id'][0]} with params {df['params'][0]}"))
    return blocks


def register() -> None:
    register_section(Section("paper", "Beside the paper's Table 1", _has_paper, _paper,
                             note_when_missing=False, metrics_ref="§3a"), before="comparison")
    register_section(Section("r_conventions", "r(CV, share) under the paper's conventions",
                             _has_r_conventions, _r_conventions, what="r-conventions study",
                             command="attnbase study r-conventions --db {db} --run {run}",
                             metrics_ref="§1, §3, §3a"), before="norm_cv")
