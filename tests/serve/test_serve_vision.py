"""Vision runs through the service: token names from the family's layout ([CLS], reg<i>,
p(row,col)), drop_sink removing the whole sink set ([CLS] + 4 registers), and the compare page's
scaling figure over three runs of different sizes."""

from __future__ import annotations

import numpy as np
import pytest
from serve_fixtures import Server

pytestmark = pytest.mark.slow  # two image runs and a server: ~7 s


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
    srv = Server(db)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
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
