"""Image corpora: pixels bounded by a documented limit read from the header (issue 44 item 10)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from attnbase.errors import CorpusError
from attnbase.extract import vision
from attnbase.warehouse import open_run


def _grey_png(path, w: int, h: int) -> None:
    """A valid greyscale PNG of ``w x h`` zero pixels: a small file with large header dimensions."""
    co = zlib.compressobj(9)
    row = b"\x00" * (w + 1)  # filter byte + one byte per pixel
    data = b"".join(co.compress(row) for _ in range(h)) + co.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def _extract(cli, corpus, db):
    return cli("extract", "--db", db, "--model", "tiny-vit", "--corpus", corpus, "--seqs", 1,
               "--run", "r", "-q")


def test_huge_dimension_png_refused_before_decoding(cli, tmp_path):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _grey_png(imgs / "bomb.png", 13_000, 13_000)
    assert (imgs / "bomb.png").stat().st_size < 1_000_000  # small file, 169 MP declared
    db = tmp_path / "db"
    code, out, err = _extract(cli, imgs, db)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert str(imgs / "bomb.png") in err and "13000 x 13000" in err
    assert f"{vision.MAX_IMAGE_PIXELS:,}" in err and "MAX_IMAGE_PIXELS" in err


def test_normal_image_extracts(cli, tmp_path):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _grey_png(imgs / "ok.png", 96, 80)
    db = tmp_path / "db"
    code, _, err = _extract(cli, imgs, db)
    assert code == 0, err
    assert open_run(db, "r")["tokens"].shape[0] == 1


def test_limit_is_on_width_times_height(tmp_path, monkeypatch):
    monkeypatch.setattr(vision, "MAX_IMAGE_PIXELS", 100 * 100)
    _grey_png(tmp_path / "a.png", 100, 100)  # at the limit: read
    _, by_name = vision.corpus_sources(str(tmp_path), 1, 0)
    assert by_name["a.png"].shape == (100, 100, 3) and not by_name["a.png"].any()
    _grey_png(tmp_path / "b.png", 100, 101)  # one row over: refused
    with pytest.raises(CorpusError, match=r"b\.png is 100 x 101 pixels \(10,100\), over the limit"):
        vision.corpus_sources(str(tmp_path), 2, 0)
