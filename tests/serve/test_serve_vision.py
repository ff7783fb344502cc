"""Vision runs through the service: token names from the family's layout ([CLS], reg<i>,
p(row,col)), drop_sink removing the whole sink set ([CLS] + 4 registers), the compare page's
scaling figure over three runs of different sizes, and the attention rollout and high-norm
table of docs/metrics.md §6c on the run and head pages."""

from __future__ import annotations

import numpy as np
import pytest
from serve_fixtures import Server

pytestmark = pytest.mark.slow  # three image runs, two analyses and a server: ~15 s


@pytest.fixture(scope="module")
def vision_client(tmp_path_factory):
    import httpx

    from attnbase import extract_run
    from attnbase.extract import ExtractConfig
    from attnbase.warehouse import Database

    from attnbase.stats.scaling import scaling_study

    db = tmp_path_factory.mktemp("vserve") / "db"
    for run, model in (("d", "tiny-dinov2-reg"), ("v", "tiny-vit"), ("t", "tiny-deit")):
        extract_run(Database(db), run, ExtractConfig(model=model, corpus="images:sample",
                                                     n_seqs=2, batch_size=2, device="cpu"),
                    progress=False)
    scaling_study(Database(db), ["v", "t", "d"])
    from attnbase.stats.analyze import analyze_run

    for run in ("d", "v"):
        analyze_run(Database(db), run, draws=5, gauss_draws=5, seed=0, n_boot=50)
    srv = Server(db)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        c.db_path = db  # the database the server reads, for the tests' own reading
        yield c
    srv.stop()


def test_pattern_of_an_image_run(vision_client):
    url = "/api/runs/d/heads/1/2/pattern"
    w = vision_client.get(url, params={"seq": 0}).json()
    assert w["tokens"][:6] == ["[CLS]", "reg0", "reg1", "reg2", "reg3", "p(0,0)"]
    assert w["tokens"][-1] == "p(3,3)" and len(w["tokens"]) == 21
    p = np.array(w["probs"], dtype=float)
    d = np.array(vision_client.get(url, params={"seq": 0, "convention": "drop_sink"})
                 .json()["probs"], dtype=float)
    assert (d[:, :5] == 0).all()  # every key of the set dropped, not key 0 alone
    np.testing.assert_allclose(d[:, 5:], p[:, 5:] / p[:, 5:].sum(1, keepdims=True), rtol=1e-9)
    assert not np.allclose(d[:, 1:], p[:, 1:] / (1 - p[:, :1]))  # the key-0-only convention
    page = vision_client.get("/runs/d/heads/1/2")
    assert page.status_code == 200 and "p(3,3)" in page.text


def test_head_page_shows_the_window_with_its_patch_grid(vision_client):
    import base64
    import io
    import re

    from PIL import Image

    page = vision_client.get("/runs/d/heads/1/2", params={"seq": 1}).text
    m = re.search(r'src="data:image/png;base64,([^"]+)"', page)
    assert m, "no window image on the head page"
    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(m.group(1)))).convert("RGB"))
    assert img.shape == (256, 256, 3)
    # the 4 x 4 patch grid: yellow lines at 64, 128, 192 px
    for x in (64, 128, 192):
        assert (img[:, x] == (255, 255, 0)).all(axis=1).mean() > 0.95
    # inside a patch column only the three horizontal lines cross
    assert (img[:, 32] == (255, 255, 0)).all(axis=1).sum() <= 6
    # the caption names the source the catalog records for window 1
    src = vision_client.post("/api/sql", json={
        "sql": "SELECT source, x0, y0 FROM seq_sources WHERE run_id = 'd' AND seq = 1"}).json()
    name, x0, y0 = src["rows"][0]
    assert f"{name} crop ({x0}, {y0})" in page


def test_compare_page_draws_the_scaling_study(vision_client):
    page = vision_client.get("/compare", params={"runs": "v,t,d"})
    assert page.status_code == 200
    assert "mean sink mass against parameter count, slope" in page.text
    assert page.text.count("<svg") >= 1
    # one run alone is no comparison of sizes: no figure
    alone = vision_client.get("/compare", params={"runs": "d"})
    assert alone.status_code == 200 and "against parameter count" not in alone.text


def _img(page: str, alt: str) -> np.ndarray:
    import base64
    import io
    import re

    from PIL import Image

    m = re.search(r'<img src="data:image/png;base64,([^"]+)" alt="' + alt, page)
    assert m, f"no {alt!r} image on the page"
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(m.group(1)))).convert("RGB"))


def test_rollout_api_is_the_product_over_the_window_layers(vision_client):
    from attnbase.logits import softmax
    from attnbase.stats.rollout import cls_rollout
    from attnbase.warehouse import open_run

    got = vision_client.get("/api/runs/d/rollout", params={"seq": 1}).json()
    assert got["grid"] == 4 and got["first_patch"] == 5  # [CLS] and 4 registers first
    ds = open_run(vision_client.db_path, "d")
    z = ds["attn_logits"].values[:, :, 1]  # (layer, head, T, T) of window 1
    want = cls_rollout(softmax(z), 5).reshape(4, 4)
    np.testing.assert_allclose(np.array(got["rollout"]), want, rtol=1e-12)
    assert got["total"] == pytest.approx(want.sum(), rel=1e-12) and 0 < got["total"] < 1
    bad = vision_client.get("/api/runs/d/rollout", params={"seq": 9})
    assert bad.status_code == 404 and "valid: 0..1" in bad.text


def test_run_and_head_pages_draw_the_rollout_over_the_window(vision_client):
    run_page = vision_client.get("/runs/v", params={"seq": 1})
    assert run_page.status_code == 200
    rolled = _img(run_page.text, "attention rollout of window 1")
    assert rolled.shape == (256, 256, 3)
    assert "traces back to patches" in run_page.text
    # the head page shows the same picture beside the window, from the PNG route
    import io

    from PIL import Image

    head = vision_client.get("/runs/v/heads/0/1", params={"seq": 1}).text
    assert 'src="/runs/v/rollout.png?seq=1" alt="attention rollout of window 1"' in head
    png = vision_client.get("/runs/v/rollout.png", params={"seq": 1})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert (np.asarray(Image.open(io.BytesIO(png.content)).convert("RGB")) == rolled).all()
    window = _img(head, "window 1")  # the window itself: a different picture (a grid, no heat)
    assert not (window == rolled).all()
    assert vision_client.get("/runs/v/rollout.png", params={"seq": 7}).status_code == 404


def test_run_page_tabulates_high_norm_tokens_per_hidden_state(vision_client):
    import re

    page = vision_client.get("/runs/d").text
    table = page[page.index('id="high-norm"'):]
    table = table[:table.index("</table>")]
    assert len(re.findall(r"<th>H\d</th>", table)) == 4  # embeddings + 3 layers
    assert table.count('data-metric="high_norm_frac"') == 4
    assert "x the median patch norm" in page


def test_compare_page_puts_runs_with_and_without_registers_side_by_side(vision_client):
    import re

    page = vision_client.get("/compare", params={"runs": "d,v,t"}).text
    table = page[page.index('id="compare-high-norm"'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r'<tr><td><a href="/runs/(\w)">\w</a></td><td>([^<]*)</td><th>(H\d)</th>',
                      table)
    # t (DeiT) was not analysed: no rows of it; d and v with their extra tokens, H0-H3 each
    assert rows == [("d", "4 registers", f"H{i}") for i in range(4)] + \
        [("v", "none", f"H{i}") for i in range(4)]
    # a comparison whose runs have no high-norm rows has no such table
    assert 'id="compare-high-norm"' not in vision_client.get("/compare",
                                                             params={"runs": "t"}).text


def test_head_page_of_an_image_run_names_the_types_it_has_no_value_for(vision_client):
    """An image run's duplicate and induction scores are NULL (no token repeats, docs/metrics.md
    §3b): the "types at a glance" line says so instead of printing NULL, and their rank reads
    "no value", not "NULL of 0"; the previous-token score keeps its value and rank."""
    import re

    from attnbase.metrics import label

    page = vision_client.get("/runs/d/heads/1/2").text
    glance = re.search(r'<p id="head-types">(.*?)</p>', page).group(1)
    assert "NULL" not in glance
    assert f"{label('prev_token')} " in glance and "(rank " in glance
    assert (f"no {label('duplicate_token')} or {label('induction')}: no token of the run's "
            "windows repeats an earlier one") in glance
    table = page[page.index('id="metrics"'):]
    table = table[:table.index("</table>")]
    assert "NULL of 0" not in table
    row = table[table.index('data-metric="induction"'):]
    assert row[:row.index("</tr>")].endswith("<td>no value</td>")
