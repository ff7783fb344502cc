"""The registry (attnbase/metrics.py) is the one source of metric and study-result names.

Every metric an analysis or a weights run stores is registered at the level it is stored at,
every study result under its study kind (``write_study`` refuses an unregistered key), and a
registered name is typed (as a string literal, or quoted inside one: SQL, templates; a study
result as its key, ``"reversal_rate/..."``) in the registry modules and at most one other
source file (the stats module that computes it); everything else reads it from
:mod:`attnbase.metrics` (``N.ve_shuffle``, ``S.reversal.reversal_rate(d)``).
docs/metrics.md §9 is generated from it.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from attnbase.metrics import (
    API_FIELDS, COMPUTED, FAMILIES, INPUT_KINDS, INVARIANCES, LEVELS, METRICS, REGISTRY, S,
    STUDY_KINDS, STUDY_RESULTS, TABLES, metric,
)

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "attnbase"
REGISTRY_FILES = {"metrics.py", "stats/registry.py"}
#: Study results whose bare name is also something else, so only their key form
#: (``name/...``) counts as typing them; the reason for each.
BARE_NAME_ELSEWHERE = {
    "n_heads": "a runs column (runs.n_heads)",
    "n_rows": "row_stats' row count in the report's per-head aggregates",
    "n_params": "a runs column (runs.n_params)",
    "sink_mass": "a row_stats column",
    "d_entropy": "an entropy_change column", "sink_part": "an entropy_change column",
    "content_part": "an entropy_change column",
    "min_cluster": "a clusters study's params key (studies.params)",
    "bootstrap_units": "a distances/reversal study's params key (studies.params)",
    "k": "one letter: loop variables, SQL aliases", "n": "one letter: counts everywhere",
    "r": "one letter: Pearson r of inference results", "p": "one letter: p-values",
    "ci_low": "a field of every interval (inference results, r_conventions' table rows)",
    "ci_high": "a field of every interval (inference results, r_conventions' table rows)",
    "spearman": "the name of scipy's statistic (inference.spearman)",
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
            tree = ast.parse(path.read_text())
            exported = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                        for c in ast.walk(node.value)}  # function names, not metric names
            texts = [n.value for n in ast.walk(tree)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)
                     and id(n) not in exported]
        elif path.suffix == ".j2":
            texts = [path.read_text()]
        else:
            continue
        for name, pattern in quoted.items():
            if any(t == name or pattern.search(t) for t in texts):
                found[name].add(rel)
    return found


def _strings(path: Path) -> list[str]:
    """The string constants of a module but its docstrings (docs name keys as prose) and its
    ``__all__`` (function names)."""
    tree = ast.parse(path.read_text())
    skip = {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    skip |= {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
             for c in ast.walk(node.value)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in skip]


def typed_study_names(root: Path = SRC) -> dict[str, set[str]]:
    """``{study result name: {files}}`` of every source file that types the name as a key
    (``"k/"`` in ``f"k/{d}"``, ``"reversal_rate/js"``), or as the whole literal where the bare
    name means nothing else (:data:`BARE_NAME_ELSEWHERE`)."""
    names = sorted({n for _, n in STUDY_RESULTS})
    keyed = {n: re.compile(rf"(?<![\w/|:.-]){re.escape(n)}/") for n in names}
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        texts = _strings(path)
        for n in names:
            if any(keyed[n].search(t) or (t == n and n not in BARE_NAME_ELSEWHERE)
                   for t in texts):
                found[n].add(str(path.relative_to(root)))
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


def test_every_depth_and_weights_metric_is_registered():
    """What analyze writes for hidden states and a weights run writes, at their levels (an
    analysis's own rows: tests/stats/test_analyze.py::test_gqa_run_end_to_end)."""
    from attnbase.stats.depth import DEPTH_LAYER_METRICS
    from attnbase.stats.spectral import sd_tables

    stored = {("layer", m) for m in DEPTH_LAYER_METRICS}
    rng = np.random.default_rng(0)
    weights = sd_tables([(rng.standard_normal((2, 16, 4)), rng.standard_normal((2, 16, 4)))])
    for level, table in TABLES.items():
        stored |= {(level, str(m)) for m in weights[table]["metric"]}
    assert len(stored) > 15
    missing = sorted(f"{level}_metrics.{m}" for level, m in stored
                     if m not in METRICS or level not in METRICS[m].levels)
    assert missing == [], "register these in attnbase/metrics.py"


def test_registered_names_are_typed_in_one_place_beside_the_registry():
    over = {name: sorted(files - REGISTRY_FILES) for name, files in typed_names().items()
            if len(files - REGISTRY_FILES) > 1}
    assert over == {}, "read these names from attnbase.metrics (N.<name>) instead of typing them"


def test_the_names_namespace_fails_loudly():
    from attnbase.metrics import N

    assert N.ve_shuffle == "ve_shuffle" and "ve_shuffle" in dir(N)
    with pytest.raises(AttributeError, match="unknown metric 've_shufle'"):
        N.ve_shufle


def test_the_grep_sees_sql_and_literals(tmp_path):
    (tmp_path / "a.py").write_text("X = 've_shuffle'\nQ = \"SELECT 1 WHERE metric = 've_gauss'\"\n"
                                   "Y = 've_shuffle_z'\n")
    (tmp_path / "t.html.j2").write_text("{{ row['max_share'] }}")
    (tmp_path / "m.py").write_text("__all__ = ['ve_gauss']\n")  # a function's name
    found = typed_names(tmp_path)
    assert found["ve_shuffle"] == {"a.py"} and found["ve_gauss"] == {"a.py"}
    assert found["max_share"] == {"t.html.j2"} and "ve_shuffle_z" not in found


def test_statistics_and_metrics_agree():
    """A statistic analyze_run stores per head is a registered head metric of its family."""
    from attnbase.stats.registry import STATISTICS

    for name, stat in STATISTICS.items():
        if stat.head_metric:
            assert name in METRICS and "head" in METRICS[name].levels, name
        if name in METRICS:
            assert METRICS[name].family == stat.family, name


def typed_in_templates(paths) -> list[str]:
    """Each registered metric's name (as a word) or label typed in one of the templates
    ``paths``; parameters (``draws``, ``seed``) are also other tables' column names."""
    out = []
    for path in paths:
        text = path.read_text()
        for name, m in METRICS.items():
            if m.parameter:
                continue
            if re.search(rf"\b{re.escape(name)}\b", text):
                out.append(f"{path.name}: name {name}")
            if m.label in text:
                out.append(f"{path.name}: label {m.label!r}")
    return out


def test_templates_type_no_metric_name_or_label():
    """The service's and the report's templates show metrics through the registry (the serve
    filters ``label``, ``unit`` and ``num``), never by a name or label typed in them."""
    templates = sorted(SRC.rglob("*.j2"))
    assert len(templates) >= 10
    assert typed_in_templates(templates) == []


def test_the_template_grep_sees_names_and_labels(tmp_path):
    f = tmp_path / "t.html.j2"
    f.write_text("<th>key_norm_cv</th><td>{{ t.max_share|num }}</td><th>VE@8 shuffle null</th>"
                 "<td>{{ t.draws }}</td><td>{{ t.ve_at_8_x }}</td>")
    assert sorted(typed_in_templates([f])) == sorted([
        "t.html.j2: name key_norm_cv", "t.html.j2: name max_share",
        "t.html.j2: label 'VE@8 shuffle null'", "t.html.j2: label 'VE@8'"])


def test_every_entry_is_complete():
    """Study results name their kind and key; computed statistics a function reference, an
    input kind and declared invariances from the known lists; names are unique per kind."""
    assert len(REGISTRY) == len(METRICS) + len({m.name for m in REGISTRY if m.levels == ("row",)}
                                                ) + len(STUDY_RESULTS)
    for m in REGISTRY:
        assert m.family in FAMILIES and set(m.levels) <= set(LEVELS) and m.levels, m.name
        assert m.label and m.unit and m.section.startswith("§"), m.name
        if "study" in m.levels:
            assert m.kind in STUDY_KINDS and m.key and m.name in m.key, m.name
        if m.compute:
            c = m.compute
            assert c.func.startswith("attnbase.stats.") and ":" in c.func, m.name
            assert c.input in INPUT_KINDS and set(c.invariances) <= set(INVARIANCES), m.name
            assert c.reference.startswith("docs/metrics.md §"), m.name


def test_api_fields_are_the_services_contract():
    assert API_FIELDS == ("name", "label", "unit", "family", "levels", "section", "digits",
                          "parameter")
    assert [m.public()["name"] for m in METRICS.values()] == list(METRICS)


def test_study_keys_are_built_from_the_registry():
    assert S.reversal.reversal_rate("js") == "reversal_rate/js"
    assert S.clusters.cluster_size("js", 1) == "cluster_size/js/1"
    assert S.distances.n_heads == "n_heads" and "n_heads" in dir(S.distances)
    with pytest.raises(AttributeError, match="unknown 'reversal' study result 'reversal_rat'"):
        S.reversal.reversal_rat
    with pytest.raises(AttributeError, match="unknown study kind 'revrsal'"):
        S.revrsal


def test_an_unregistered_study_key_is_refused(tmp_path):
    from attnbase.errors import StatsError
    from attnbase.stats.studies import write_study
    from attnbase.warehouse import Database

    with pytest.raises(StatsError, match="'reversal_rat/js' are not registered"):
        write_study(Database(tmp_path), "reversal", ["r"], {}, {"reversal_rat/js": 0.1})


def test_study_results_are_typed_in_one_place_beside_the_registry():
    over = {n: sorted(files - REGISTRY_FILES) for n, files in typed_study_names().items()
            if len(files - REGISTRY_FILES) > 1}
    assert over == {}, "build these keys with attnbase.metrics.S.<kind>.<name>(...)"


def test_the_study_grep_sees_keys(tmp_path):
    (tmp_path / "a.py").write_text('"""reversal_rate/<d> in prose"""\n'
                                   'X = f"reversal_rate/{d}"\nY = "k/js"\nZ = "n_heads"\n'
                                   'W = "slope"\nV = "block/1"\n')
    found = typed_study_names(tmp_path)
    assert found["reversal_rate"] == {"a.py"} and found["k"] == {"a.py"}
    assert found["slope"] == {"a.py"} and "n_heads" not in found


def test_the_uniform_baseline_is_harmonic():
    from attnbase.metrics import uniform_max_share

    assert round(uniform_max_share(128, True), 5) == 0.04245
    assert uniform_max_share(128, False) == 1 / 128


def test_docs_metrics_section_9_is_generated():
    """docs/metrics.md's block between the markers is what ``python -m attnbase.metrics``
    writes (regenerate: ``python -m attnbase.metrics docs/metrics.md``)."""
    from attnbase.metrics import doc_block

    text = (ROOT / "docs" / "metrics.md").read_text()
    assert doc_block(text) == text, "run `python -m attnbase.metrics docs/metrics.md`"


def test_computed_statistics_are_the_stats_view():
    from attnbase.stats.registry import STATISTICS

    assert list(STATISTICS) == list(COMPUTED)
