"""``attnbase compact`` on a run whose store is on S3 (a real moto server): every stored logits
chunk is compared first (a damaged one stops it with nothing changed), then the logits objects
are deleted and the catalog marks them derived, exactly as for a local run."""

from __future__ import annotations

import numpy as np

from attnbase.warehouse import Database, RunStore


def test_compact_an_s3_run(tmp_path, s3_bucket, cli):
    from attnbase.extract.config import ExtractConfig
    from attnbase.runner import extract_run

    db = tmp_path / "db"
    cfg = ExtractConfig(model="tiny-neox", n_seqs=4, seq_len=16, batch_size=2, device="cpu",
                        capture=("keys", "queries", "logits", "hidden"))
    extract_run(Database(db), "st", cfg, progress=False, store=f"{s3_bucket}/runs")
    d = Database(db)
    store = RunStore(d.store_path("st"), "st")
    assert store.remote and "attn_logits" in store.stored_names()
    before = store.read("attn_logits")
    logits = store.path / "attn_logits"
    objects = logits.files()
    chunks = sorted(k for k in objects if k.startswith("c/"))
    assert chunks and "zarr.json" in objects

    # a damaged chunk: compact stops before changing anything (catalog, group, objects)
    obj = logits / chunks[-1]
    good = obj.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x20
    obj.put([bytes(bad)])
    code, out, err = cli("compact", "--db", db, "--run", "st")
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err, (out, err)
    assert logits.files() == objects
    assert {r["name"]: r["derived"] for r in d.array_rows("st")}["attn_logits"] is False
    assert "attn_logits" in RunStore(d.store_path("st"), "st").stored_names()
    obj.put([good])

    code, out, err = cli("compact", "--db", db, "--run", "st")
    assert code == 0, err
    assert f"{len(chunks)} chunks compared" in out and "max abs difference 0" in out
    assert "MiB freed" in out
    assert logits.files() == {}  # every logits object deleted
    fresh = RunStore(d.store_path("st"), "st")
    assert "attn_logits" not in fresh.stored_names() and "attn_logits" in fresh.derived()
    assert np.array_equal(fresh.read("attn_logits"), before)  # formed on read, equal
    assert {r["name"]: r["derived"] for r in d.array_rows("st")}["attn_logits"] is True
    code, out, err = cli("verify", "--db", db, "--run", "st")
    assert code == 0, out + err
    code, out, _ = cli("compact", "--db", db, "--run", "st")  # idempotent
    assert code == 0 and "nothing to compact" in out
