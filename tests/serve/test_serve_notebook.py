"""The notebook client and the pages over a demo-like database: a MiniLM run named as the
README's tour names it (``demo``), a second model's run and a weights-only run, served by a real
``attnbase serve`` on loopback. The README's Python example runs as printed against it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from serve_fixtures import Server, free_port

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
MINILM, OTHER, WEIGHTS = "demo", "tiny-llama-default", "minilm-default-weights"


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory):
    from attnbase.studies.weights import weights_run
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database

    path = tmp_path_factory.mktemp("notebook") / "db"
    db = Database(path)
    for run_id, model in ((MINILM, "minilm"), (OTHER, "tiny-llama")):
        cfg = ExtractConfig(model=model, corpus="default", n_seqs=4, seq_len=16, batch_size=4,
                            device="cpu")
        extract_run(db, run_id, cfg, progress=False)
        analyze_run(db, run_id, draws=5, gauss_draws=20, seed=3, n_boot=50)
    weights_run(db, WEIGHTS, "minilm")
    srv = Server(path)
    srv.db_path = path
    yield srv
    srv.stop()


def _readme_python() -> str:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    block = next(b for b in blocks if "attnbase.connect(" in b)
    return block


def test_readme_example_runs_as_printed(demo_like):
    printed = _readme_python()
    code = (printed.replace("http://127.0.0.1:8642", demo_like.url)
            .replace('"attnbase-db"', repr(str(demo_like.db_path))))
    assert code != printed  # the example names the default address and database
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    svc, p = scope["svc"], scope["p"]
    # the printed SQL keeps to one run: MiniLM's 6 layers, not the other model's
    assert "where run_id = 'demo'" in code
    df = svc.sql("select layer, avg(sink_mass) from row_stats where run_id = 'demo' "
                 "group by 1 order by 1")
    assert df["layer"].to_list() == list(range(6))
    assert p.probs.shape == (16, 16) and len(p.tokens) == 16 and p.tokens[0] == "[CLS]"
    assert svc.heads(MINILM).height == 6 * 12
    svc.close()


def test_frames_and_pattern(demo_like):
    import attnbase
    import httpx
    import polars as pl

    with attnbase.connect(demo_like.url) as svc:
        runs = svc.runs()
        assert isinstance(runs, pl.DataFrame)
        assert set(runs["run_id"]) == {MINILM, OTHER, WEIGHTS}
        t1 = svc.table1()
        assert isinstance(t1, pl.DataFrame) and set(t1["run_id"]) == {MINILM, OTHER}  # no weights
        heads = svc.heads(OTHER)
        assert isinstance(heads, pl.DataFrame) and heads.height > 0
        p = svc.pattern(OTHER, 1, 0, seq=2, convention="drop_sink")
        raw = httpx.get(f"{demo_like.url}/api/runs/{OTHER}/heads/1/0/pattern",
                        params={"seq": 2, "convention": "drop_sink"}).json()
        assert p.tokens == raw["tokens"] and p.token_ids == raw["token_ids"]
        want = np.array([[np.nan if v is None else v for v in r] for r in raw["probs"]])
        np.testing.assert_array_equal(p.probs, want)
        assert np.isnan(p.probs[0]).all()  # drop_sink: query 0 has only the sink
        np.testing.assert_allclose(np.nansum(p.probs[1:], axis=1), 1.0, atol=1e-12)
        long = p.to_polars()
        assert long.height == 16 * 16 and long["key_token"][1] == p.tokens[1]
        html = p._repr_html_()
        assert html.count("<td ") == 16 * 16 and "<script" not in html
        assert "http" not in html  # offline: nothing fetched from anywhere
        assert any(t.startswith("␣") for t in p.tokens)  # decoded text, not Ġ pieces


def test_errors_name_the_url_and_the_message(demo_like):
    import attnbase
    from attnbase.errors import AttnbaseError

    dead = f"http://127.0.0.1:{free_port()}"
    with attnbase.connect(dead) as svc, pytest.raises(AttnbaseError) as err:
        svc.runs()
    assert dead in str(err.value) and "cannot reach the service" in str(err.value)
    with attnbase.connect(demo_like.url) as svc:
        with pytest.raises(AttnbaseError) as err:
            svc.pattern(MINILM, 9, 0, seq=0)
        assert f"{demo_like.url}/api/runs/{MINILM}/heads/9/0/pattern" in str(err.value)
        assert "404" in str(err.value) and "no layer 9 (valid: 0..5)" in str(err.value)
        with pytest.raises(AttnbaseError, match="no activations"):
            svc.pattern(WEIGHTS, 0, 0, seq=0)


def test_weights_only_runs_apart(demo_like):
    import httpx

    html = httpx.get(demo_like.url + "/").text
    main, _, weights = html.partition("Weights-only runs")
    assert f'href="/runs/{WEIGHTS}"' in weights and f'href="/runs/{WEIGHTS}"' not in main
    compare = re.search(r'id="compare" href="([^"]+)"', main).group(1)
    assert WEIGHTS not in compare and MINILM in compare and OTHER in compare
    assert "0/0" not in main and "None" not in html
    r = httpx.get(f"{demo_like.url}/api/runs/{WEIGHTS}/heads/0/0/pattern", params={"seq": 0})
    assert r.status_code == 404 and "no activations" in r.json()["detail"]
    page = httpx.get(f"{demo_like.url}/runs/{WEIGHTS}/heads/0/0")
    assert page.status_code == 200 and "weights-only run" in page.text
    assert 'id="pattern"' not in page.text
