"""``attnbase table1 --published`` and the ``published_table1`` view reproduce docs/metrics.md §3a."""

from __future__ import annotations

import re

from attnbase.warehouse.published import published_rows
from attnbase.warehouse import Database, read_sql

#: docs/metrics.md §3a verbatim (the paper's Table 1 as printed; "(dagger)" is the paper's †).
SPEC_3A = """
| GPT-2 small | openai-community/gpt2 | 12 | 64 | 0.151 | 0.774 | 0.294 | 0.514 | L2 (17%) | 0.37 |
| GPT-2 medium | openai-community/gpt2-medium | 24 | 64 | 0.210 | 0.758 | 0.294 | 0.471 | L4 (17%) | 0.45 |
| GPT-2 large | openai-community/gpt2-large | 36 | 64 | 0.249 | 0.732 | 0.294 | 0.422 | L8 (22%) | 0.59 |
| GPT-2 XL | openai-community/gpt2-xl | 48 | 64 | 0.307 | 0.737 | 0.294 | 0.415 | L8 (17%) | 0.70 |
| Pythia 160M | EleutherAI/pythia-160m | 12 | 64 | 0.258 | 0.885 | 0.294 | 0.819 | L2 (17%) | 0.28 |
| Pythia 410M | EleutherAI/pythia-410m | 24 | 64 | 0.260 | 0.783 | 0.294 | 0.636 | L6 (25%) | 0.05 (dagger) |
| Pythia 1B | EleutherAI/pythia-1b | 16 | 256 | 0.254 | 0.572 | 0.160 | 0.370 | L4 (25%) | 0.18 |
| Pythia 1.4B | EleutherAI/pythia-1.4b | 24 | 128 | 0.289 | 0.733 | 0.212 | 0.554 | L3 (12%) | 0.19 |
| Pythia 2.8B | EleutherAI/pythia-2.8b | 32 | 80 | 0.286 | 0.753 | 0.262 | 0.539 | L3 (9%) | 0.07 |
"""


def _spec_rows() -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in SPEC_3A.strip().splitlines()]
    return [[c.replace(" (dagger)", "†") for c in r] for r in rows]


def _printed_rows(out: str) -> list[list[str]]:
    cells = [[c.strip() for c in re.split(r"[│┃]", line)[1:-1]] for line in out.splitlines()
             if line.startswith("│")]
    return [c[1:11] for c in cells if c and c[0] == "paper"]


def test_table1_published_reproduces_the_spec_digits(cli, tmp_path):
    code, out, err = cli("table1", "--published", "--db", tmp_path / "none")
    assert code == 0, err
    assert _printed_rows(out) == _spec_rows()
    assert "no analysed runs" in out  # no database: the paper's rows alone, said so


def test_published_view_holds_the_packaged_rows(tmp_path):
    db = Database(tmp_path / "db")
    db.migrate()
    view = read_sql(tmp_path / "db", "SELECT * FROM published_table1").to_dicts()
    spec = _spec_rows()
    assert [(v["model"], v["hub_id"], v["n_layers"], v["d_head"]) for v in view] == \
        [(s[0], s[1], int(s[2]), int(s[3])) for s in spec]
    for v, s, p in zip(view, spec, published_rows()):
        assert [f"{v[k]:.3f}" for k in ("key_norm_cv", "ve_at_8", "ve_gauss", "ve_shuffle")] == s[4:8]
        assert f"L{v['onset_layer']} ({v['onset_percent']}%)" == s[8]
        assert abs(v["onset_depth"] - v["onset_layer"] / v["n_layers"]) < 1e-12
        assert f"{v['r_cv_share']:.2f}" + ("†" if v["r_cv_share_p_ge_05"] else "") == s[9]
        assert v["onset_percent"] == round(100 * v["onset_layer"] / v["n_layers"]) or \
            v["model"] == "Pythia 1.4B"  # 3/24 = 12.5% printed as 12%
        assert {k: v[k] for k in p} == p
