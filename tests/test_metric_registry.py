"""The metric registry (attnbase/metrics.py) is the one source of metric names.

Every metric an analysis or a weights run stores is registered at the level it is stored at,
and a registered name is typed (as a string literal, or quoted inside one: SQL) in the registry
modules and at most one other source file; the files beyond that are listed in
:data:`TYPED_ELSEWHERE`, which may only shrink.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from attnbase.metrics import FAMILIES, LEVELS, METRICS, TABLES, metric

SRC = Path(__file__).resolve().parent.parent / "src" / "attnbase"
REGISTRY_FILES = {"metrics.py", "stats/registry.py"}

#: name -> source files beyond the registry and its one other file that still type it. Each
#: entry is debt: read the name from attnbase.metrics there, then remove it here.
TYPED_ELSEWHERE: dict[str, set[str]] = {
    "filtering_erank": {"reports/sections_depth.py"},
    "key_norm_cv": {"reports/sections.py", "serve/runs.py", "stats/norms.py", "stats/queries.py",
                    "stats/r_conventions.py", "warehouse/published.py"},
    "key_norm_cv_baseline": {"reports/sections.py", "serve/runs.py"},
    "key_norm_cv_excl_sink": {"stats/norms.py", "stats/r_conventions.py"},
    "max_real_eig": {"reports/sections_depth.py"},
    "max_share": {"reports/sections.py", "serve/runs.py", "stats/queries.py",
                  "stats/r_conventions.py"},
    "n_head_pairs": {"reports/sections.py"},
    "n_unstable": {"reports/sections_depth.py"},
    "onset_depth": {"reports/sections.py", "stats/concentration.py", "warehouse/published.py"},
    "onset_layer": {"reports/sections.py", "reports/sections_paper.py", "stats/concentration.py",
                    "warehouse/published.py"},
    "r_cv_share": {"reports/sections_paper.py", "warehouse/published.py"},
    "r_cv_share_ci_high": {"reports/sections.py"},
    "r_cv_share_ci_low": {"reports/sections.py"},
    "r_cv_share_p": {"warehouse/published.py"},
    "r_cv_share_spearman": {"reports/sections.py"},
    "r_cv_share_spearman_p": {"reports/sections.py"},
    "rank_collapse": {"reports/sections_depth.py"},
    "rank_collapse_excl_sink": {"reports/sections_depth.py"},
    "rank_collapse_sd": {"reports/sections_depth.py"},
    "routing_erank": {"commands/weights.py", "reports/sections_depth.py"},
    "routing_erank_pr": {"reports/sections_depth.py"},
    "routing_fraction": {"commands/weights.py", "reports/sections_depth.py"},
    "row_max_share": {"stats/r_conventions.py"},
    "share_heads_unstable": {"commands/weights.py"},
    "ve_at_8": {"warehouse/published.py"},
    "ve_gauss": {"reports/sections.py", "warehouse/published.py"},
    "ve_shuffle": {"warehouse/published.py"},
}


def typed_names(root: Path = SRC) -> dict[str, set[str]]:
    """``{registered name: {files}}`` of every source file (``.py`` and templates) that types
    the name as a string literal or quotes it inside one (``'ve_shuffle'`` in SQL)."""
    quoted = {name: re.compile(rf"""['"]{re.escape(name)}['"]""")
              for name, m in METRICS.items() if not m.parameter}
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.suffix == ".py":
            texts = [n.value for n in ast.walk(ast.parse(path.read_text()))
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        elif path.suffix == ".j2":
            texts = [path.read_text()]
        else:
            continue
        for name, pattern in quoted.items():
            if any(t == name or pattern.search(t) for t in texts):
                found[name].add(rel)
    return found


def test_every_registered_metric_is_complete():
    for name, m in METRICS.items():
        assert m.name == name and m.label and m.unit and m.section.startswith("§")
        assert m.family in FAMILIES and m.levels and set(m.levels) <= set(LEVELS), name
        for level in m.levels:
            assert f"FROM {TABLES[level]} WHERE metric = '{name}'" in m.sql(level)


def test_unknown_metric_names_the_registered_ones():
    with pytest.raises(KeyError, match="registered: .*ve_shuffle"):
        metric("ve_shufle")


def test_every_metric_an_analysis_stores_is_registered(tmp_path):
    """A synthetic run with hidden states through the real analyze_run, and a weights run's
    tables: every (level, metric) in the catalog's tables is registered at that level."""
    sys.path.insert(0, str(Path(__file__).parent / "stats"))
    from synth import ingest_synthetic, make_info, make_run_arrays

    from attnbase.stats.analyze import analyze_run
    from attnbase.stats.spectral import sd_tables
    from attnbase.warehouse import Database

    db = Database(tmp_path)
    info = make_info(n_layers=2, n_heads=2, n_kv_heads=1, d_head=8, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=4, T=12, sink_layers=(1,), sink_logit=4.0)
    ingest_synthetic(db, "r", info, keys, logits)
    analyze_run(db, "r", draws=5, gauss_draws=10, seed=0, n_boot=50)
    stored = set()
    with db.connect(read_only=True) as con:
        for level, table in TABLES.items():
            stored |= {(level, m) for (m,) in con.execute(f"SELECT DISTINCT metric FROM {table}")
                       .fetchall()}
    from attnbase.stats.depth import DEPTH_LAYER_METRICS

    stored |= {("layer", m) for m in DEPTH_LAYER_METRICS}
    rng = np.random.default_rng(0)
    weights = sd_tables([(rng.standard_normal((2, 16, 4)), rng.standard_normal((2, 16, 4)))])
    for level, table in TABLES.items():
        stored |= {(level, str(m)) for m in weights[table]["metric"]}
    assert len(stored) > 40
    missing = sorted(f"{level}_metrics.{m}" for level, m in stored
                     if m not in METRICS or level not in METRICS[m].levels)
    assert missing == [], "register these in attnbase/metrics.py"


def test_registered_names_are_typed_in_one_place_beside_the_registry():
    over = {}
    for name, files in typed_names().items():
        rest = files - REGISTRY_FILES - TYPED_ELSEWHERE.get(name, set())
        if len(rest) > 1:
            over[name] = sorted(rest)
    assert over == {}, "read these names from attnbase.metrics instead of typing them"


def test_the_debt_list_only_shrinks():
    """An entry of TYPED_ELSEWHERE that is no longer typed there must leave the list."""
    typed = typed_names()
    stale = {name: sorted(files - typed.get(name, set()))
             for name, files in TYPED_ELSEWHERE.items() if files - typed.get(name, set())}
    assert stale == {}


def test_the_grep_sees_sql_and_literals(tmp_path):
    (tmp_path / "a.py").write_text("X = 've_shuffle'\nQ = \"SELECT 1 WHERE metric = 've_gauss'\"\n"
                                   "Y = 've_shuffle_z'\n")
    (tmp_path / "t.html.j2").write_text("{{ row['max_share'] }}")
    found = typed_names(tmp_path)
    assert found["ve_shuffle"] == {"a.py"} and found["ve_gauss"] == {"a.py"}
    assert found["max_share"] == {"t.html.j2"} and "ve_shuffle_z" not in found
