"""The methods section: every convention behind the numbers, their provenance, nulls and seeds."""

from __future__ import annotations

import polars as pl
from markupsafe import Markup

from attnbase.contract import COMPUTED_ON, computed_on
from attnbase.formatting import fmt
from attnbase.reports.blocks import Block, Context, Para, Section, Table, register_section
from attnbase.reports.data import MIN_ROW_KEYS, RunData
from attnbase.reports.sections import onset_threshold

PROVENANCE = (
    ("model", "model"), ("model_revision", "model revision"), ("family", "family"),
    ("config_hash", "config hash"), ("corpus", "corpus"), ("corpus_hash", "corpus hash"),
    ("dtype", "dtype"), ("n_seqs", "sequences"), ("seq_len", "tokens per sequence"),
    ("n_layers", "layers"), ("n_heads", "heads"), ("n_kv_heads", "kv heads"),
    ("d_head", "d_head"), ("rotary", "rotary"), ("causal", "causal"),
    ("sink_token", "sink token"), ("sink_positions", "sink positions"),
    ("n_params", "parameters"), ("status", "status"), ("created_at", "created"),
    ("finished_at", "finished"), ("attnbase_version", "attnbase version"),
)


def key_kind(runs) -> str:
    """What the stored ``keys`` are for these runs: pre-RoPE only where a family is rotary."""
    rotary = {bool(r.run.get("rotary")) for r in runs}
    if rotary == {True}:
        return "pre-RoPE keys"
    if rotary == {False}:
        return "keys (the key projection's output; no rotary embedding in this family)"
    return "keys (pre-RoPE for the rotary families, the key projection's output otherwise)"


def _null_rows(run: RunData) -> list[list[str]]:
    if run.null_tests.height == 0:
        return []
    agg = (run.null_tests.group_by("metric", "null_model")
           .agg(pl.len().alias("tests"), pl.col("draws").min().alias("dmin"),
                pl.col("draws").max().alias("dmax"), pl.col("seed").min().alias("smin"),
                pl.col("seed").max().alias("smax"), pl.col("seed").n_unique().alias("nseed"))
           .sort("metric", "null_model"))
    rows = []
    for metric, null, tests, dmin, dmax, smin, smax, nseed in agg.iter_rows():
        draws = fmt(dmin) if dmin == dmax else f"{fmt(dmin)}–{fmt(dmax)}"
        seeds = fmt(smin) if nseed == 1 else f"{nseed} seeds, {fmt(smin)}–{fmt(smax)}"
        rows.append([run.run_id, metric, null, fmt(tests), draws, seeds])
    return rows


def _methods(ctx: Context) -> list[Block]:
    runs = ctx.all_runs
    blocks: list[Block] = [Para(Markup(
        "This report reads the catalog at <code>{}</code> and computes no statistic: every "
        "number is a catalog value or a plain mean of catalog values, named in the caption that "
        "shows it. Section numbers (§) refer to <code>docs/metrics.md</code>.").format(
            ctx.db.name if ctx.db is not None else "DB"))]
    blocks.append(Table(
        ["field"] + [r.run_id for r in runs],
        [[label] + [fmt(r.run.get(key)) for r in runs] for key, label in PROVENANCE],
        caption="Provenance of each run (catalog table runs)."))
    on = [computed_on(r.run) for r in runs]
    blocks.append(Table(
        ["field"] + [r.run_id for r in runs],
        [[label] + [o[key] for o in on] for key, label in COMPUTED_ON],
        caption="What computed each run (its config in catalog table runs): the device, the "
                "model's compute dtype and the dtype its float arrays are stored in, the torch "
                "and CUDA versions, and the path that computed the row statistics (numba: the "
                "compiled CPU kernel; torch: the device path). ? = not recorded (a run "
                "registered before they were)."))
    thr = onset_threshold(ctx.run)
    keys = key_kind(runs)
    conventions = [
        ("§1 key-norm CV", f"std / mean of ‖k‖₂ of {keys}, pooled over all sequences and "
         "tokens including the sink token (variant key_norm_cv_excl_sink leaves the sink "
         "positions out: token 0, or every position of a sink set); "
         "baseline 1/√(2 d_head); model figure = mean over layers of the mean over heads."),
        ("§2 VE@8", "per (layer, head, sequence): Σ_{r≤8} σ_r² / Σ σ_r² of the centred T × d_head "
         f"key matrix ({keys}), then mean over sequences. Gauss null: i.i.d. N(0,1) matrices of "
         "the same shape; shuffle null: each key dimension permuted independently across the "
         "sequence's tokens."),
        ("§3 max share", "column share (default): max over key positions of the mean over "
         f"queries and sequences of A[i, j]. Onset layer: first layer with mean over heads > "
         f"{fmt(thr, 2, style='fixed')}, reported 0-based and as depth onset_layer / n_layers. "
         "r(CV, max share): "
         "Pearson over all (layer, head) pairs with a two-sided p-value."),
        ("§3, §4 row statistics", f"means over attention rows with n_keys ≥ {MIN_ROW_KEYS} (rows "
         "with fewer keys have no content geometry); sink = key 0; sink balance "
         "b(p) = √((n−1)/n)(ln p₀ − mean_{j≥1} ln p_j) from the stored logits; entropies in nats; "
         "H(p) = H_b(s) + (1 − s) H(π) with π the renormalised content keys."),
        ("§5 conventions", "with_sink uses the full row p, drop_sink the content composition π."),
        ("§6 rank collapse", "‖res(H)‖₁,∞ / ‖H‖₁,∞ with the composite norm "
         "√(‖X‖₁‖X‖_∞), per sequence, mean ± sd; hidden-state index 0 = embeddings."),
        ("§7 routing", "M = W_Q W_Kᵀ split into filtering S = (M + Mᵀ)/2 and routing "
         "A = (M − Mᵀ)/2; routing fraction ‖A‖²_F/‖M‖²_F; effective rank Roy-Vetterli."),
        ("§8 inference", "empirical p = (1 + #{null ≥ statistic}) / (1 + draws), one-sided; "
         "q-values Benjamini-Hochberg across heads."),
    ]
    blocks.append(Table(["convention", "as used here"], [list(c) for c in conventions],
                        caption="Conventions (docs/metrics.md defaults unless stated otherwise)."))
    null_rows = [row for r in runs for row in _null_rows(r)]
    if null_rows:
        blocks.append(Table(["run", "metric", "null", "heads tested", "draws", "seed"],
                            null_rows, caption="Null distributions as stored in null_tests."))
    else:
        blocks.append(Para(Markup("No null tests in the catalog for these runs.")))
    return blocks


register_section(Section("methods", "Methods", lambda c: True, _methods, metrics_ref="§1-8",
                         note_when_missing=False))
