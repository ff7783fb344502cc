"""What the GPU path shares with the CPU, tested on the CPU: the torch statistics path against the
numba kernel through a whole extraction, half precision (logits in float32 from half q and k),
``--store-dtype``, the run's provenance and the device refusals (one line, exit 2, nothing
written). The CUDA-only parts run in benchmarks/gpu.py on a CUDA machine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnbase.extract import ExtractConfig, capture_batches, corpus_windows, load_model
from attnbase.extract.config import HALF_TOLERANCE
from attnbase.runner import extract_run
from attnbase.warehouse.database import Database
from attnbase.warehouse.runs.store import RunStore

SLOW = pytest.mark.slow
#: every family; the fast suite runs the one with GQA, QK-norm and sliding windows
FAMILIES = (pytest.param("tiny-gpt2", marks=SLOW), pytest.param("tiny-neox", marks=SLOW),
            pytest.param("tiny-llama", marks=SLOW), "tiny-gemma3", pytest.param("minilm", marks=SLOW))
ALL = ("keys", "queries", "logits", "hidden")



def _rows(db, run):
    with db.connect(read_only=True) as con:
        return con.execute("SELECT * EXCLUDE (run_id) FROM row_stats WHERE run_id = ? "
                           "ORDER BY layer, head, seq, query", [run]).fetchnumpy()


def _cfg(model, **kw):
    base = dict(model=model, n_seqs=4, seq_len=16, batch_size=2, device="cpu")
    return ExtractConfig(**{**base, **kw})


@pytest.mark.parametrize("model", FAMILIES)
def test_torch_statistics_path_equals_the_numba_kernel_through_an_extraction(tmp_path, model,
                                                                              monkeypatch):
    from attnbase.extract.batchstats import BatchStats

    copies = BatchStats.host_copies
    extract_run(Database(tmp_path), "numba", _cfg(model, capture=ALL), progress=False)
    assert BatchStats.host_copies == copies  # the numba path does not use it
    monkeypatch.setenv("ATTNBASE_ROWSTATS", "torch")
    extract_run(Database(tmp_path), "torch", _cfg(model, capture=ALL), progress=False)
    # every layer's statistics on the logits' device, read back once per batch (2 batches);
    # nothing per layer (test_rowstats: the path runs on the meta device)
    assert BatchStats.host_copies - copies == 2
    db = Database(tmp_path)
    cfgs = {r: json.loads(db.run_info(r)["config"])["stats_backend"] for r in ("numba", "torch")}
    assert cfgs == {"numba": "numba", "torch": "torch"}
    a, b = _rows(db, "numba"), _rows(db, "torch")
    for col in a:
        np.testing.assert_allclose(b[col], a[col], rtol=1e-6, atol=1e-6, equal_nan=True,
                                   err_msg=col)
    sa, sb = RunStore(db.store_path("numba"), "a"), RunStore(db.store_path("torch"), "b")
    for name in sa.stored_names():
        assert np.array_equal(sa.read(name), sb.read(name), equal_nan=True), name


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("model", [pytest.param("tiny-gpt2", marks=SLOW), "tiny-llama",
                                   pytest.param("tiny-gemma3", marks=SLOW)])
def test_half_precision_statistics_within_tolerance_of_float32(tmp_path, model, dtype):
    extract_run(Database(tmp_path), "f32", _cfg(model), progress=False)
    extract_run(Database(tmp_path), "half", _cfg(model, dtype=dtype, store_dtype="float32"), progress=False)
    db = Database(tmp_path)
    a, b = _rows(db, "f32"), _rows(db, "half")
    for col in ("sink_mass", "max_prob", "entropy"):
        diff = np.nanmax(np.abs(a[col] - b[col]))
        print(f"{model} {dtype} {col}: max |half - float32| = {diff:.2e}")
        assert diff <= HALF_TOLERANCE[dtype], col
        assert np.isfinite(b[col]).all()
    # the half run's logits are derived (q and k stored exactly in float32) and equal the
    # float32 logits the capture formed from them
    stored = RunStore(db.store_path("half"), "half")
    assert "attn_logits" not in stored.stored_names()
    extract_run(Database(tmp_path), "half-s", _cfg(model, dtype=dtype, store_dtype="float32", capture=ALL),
                progress=False)
    assert np.array_equal(stored.read("attn_logits"),
                          RunStore(db.store_path("half-s"), "s").read("attn_logits"))


def test_float16_logits_are_formed_in_float32_without_spurious_inf():
    """q.k beyond float16's range: a float16 matmul of the same q and k overflows (the negative
    control), the capture's float32 logits stay finite and so do the statistics."""
    lm = load_model("tiny-llama", dtype="float16", device="cpu")
    with torch.no_grad():
        for layer in lm.model.layers:
            layer.self_attn.q_proj.weight.mul_(1000)
            layer.self_attn.k_proj.weight.mul_(1000)
    win = corpus_windows(lm, "default", n_seqs=1, seq_len=16, seed=0)
    (cb,) = list(capture_batches(lm, win.tokens, 1, ("keys", "queries", "logits"),
                                 store_dtype="float32"))
    z = cb.arrays["attn_logits"]
    q = torch.from_numpy(cb.arrays["queries"][1]).half()
    k = torch.from_numpy(cb.arrays["keys_rot"][1]).half().repeat_interleave(2, 0)
    half = torch.matmul(q, k.transpose(-1, -2))
    assert not torch.isfinite(half).all()  # float16 overflows here
    live = ~np.isneginf(z)
    assert np.isfinite(z[live]).all() and np.abs(z[live]).max() > 65504 * 0.125
    for col in ("sink_mass", "max_prob", "entropy"):
        assert np.isfinite(cb.row_stats[col]).all(), col


@pytest.mark.slow  # 4-5 s, three extractions: run by `make test-slow`
def test_store_dtype_round_trips(tmp_path):
    import attnbase

    extract_run(Database(tmp_path), "f32", _cfg("tiny-llama", capture=ALL), progress=False)
    for sd in ("float16", "bfloat16"):
        extract_run(Database(tmp_path), sd, _cfg("tiny-llama", capture=ALL, store_dtype=sd), progress=False)
    db = Database(tmp_path)
    full = RunStore(db.store_path("f32"), "f32")
    for sd in ("float16", "bfloat16"):
        store = RunStore(db.store_path(sd), sd)
        rows = {r["name"]: r["dtype"] for r in db.array_rows(sd)}
        assert rows["queries"] == sd and rows["tokens"] == "int32"
        rounded = torch.from_numpy(full.read("queries")).to(getattr(torch, sd))
        # float16 reads back as float16 (numpy has it), bfloat16 as float32 (numpy has none)
        want = rounded.numpy() if sd == "float16" else rounded.float().numpy()
        got = store.read("queries")
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert np.array_equal(attnbase.open_run(db, sd).queries.values, want)
        # statistics come from the float32 logits, before the cast
        a, b = _rows(db, "f32"), _rows(db, sd)
        assert np.array_equal(a["entropy"], b["entropy"], equal_nan=True)
    from attnbase.warehouse.runs.verify import verify

    assert verify(db).ok


def test_provenance_and_refusals(tmp_path, cli):
    code, out, err = cli("extract", "--db", tmp_path / "db", "--model", "tiny-gpt2", "--seqs", 2,
                         "--seq-len", 8, "--run", "r", "--device", "auto")
    assert code == 0 and "on cpu (--device auto: no CUDA device)" in out
    cfg = json.loads(Database(tmp_path / "db").run_info("r")["config"])
    assert cfg["device"] == "cpu" and cfg["stats_backend"] == "numba"
    assert cfg["torch"] == torch.__version__ and "device_name" in cfg
    for argv, want in [
        (("--device", "cuda"), "CPU-only build"),
        (("--device", "cuda:9"), "CPU-only build" if torch.version.cuda is None else "no such CUDA device"),
        (("--device", "tpu"), "unknown device 'tpu'"),
        (("--store-dtype", "int8"), "unknown --store-dtype 'int8'"),
    ]:
        code, out, err = cli("extract", "--db", tmp_path / "new", "--model", "tiny-gpt2",
                             "--seqs", 2, "--seq-len", 8, "--run", "x", *argv)
        assert code == 2 and want in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not (tmp_path / "new").exists()  # nothing written


def test_runs_show_what_computed_each_run(tmp_path, cli, monkeypatch):
    """``attnbase runs`` (table and json) shows the device, the store dtype, the torch and CUDA
    versions and the statistics backend of each run, from its config."""
    extract_run(Database(tmp_path), "a", _cfg("tiny-gpt2", n_seqs=2, store_dtype="bfloat16"), progress=False)
    monkeypatch.setenv("ATTNBASE_ROWSTATS", "torch")
    extract_run(Database(tmp_path), "b", _cfg("tiny-gpt2", n_seqs=2), progress=False)
    code, out, err = cli("runs", "--db", tmp_path, "--format", "json")
    assert code == 0, err
    rows = {r["run_id"]: r for r in json.loads(out)}
    assert (rows["a"]["store_dtype"], rows["a"]["stats_backend"]) == ("bfloat16", "numba")
    assert (rows["b"]["store_dtype"], rows["b"]["stats_backend"]) == ("float32", "torch")
    want_cuda = torch.version.cuda or "none"
    for r in rows.values():
        assert (r["device"], r["torch"], r["cuda"]) == ("cpu", torch.__version__, want_cuda)
    code, out, _ = cli("runs", "--db", tmp_path)
    line = next(ln for ln in out.splitlines() if ln.strip("│ ").startswith("a "))
    assert "float32 -> bfloat16" in line and f"cpu (torch {torch.__version__}" in line
    assert "numba" in line


def test_a_resume_on_another_device_is_refused(tmp_path, cli):
    db = Database(tmp_path)
    extract_run(db, "r", _cfg("tiny-gpt2"), progress=False)
    # as if its first batches had run on a GPU and it was interrupted there
    with db.transaction() as con:
        cfg = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
        cfg.update(device="cuda:0", device_name="NVIDIA H200")
        con.execute("UPDATE runs SET config = ?, status = 'interrupted'", [json.dumps(cfg)])
        con.execute("UPDATE batches SET status = 'pending' WHERE batch = 1")
    code, out, err = cli("extract", "--db", tmp_path, "--model", "tiny-gpt2", "--seqs", 4,
                         "--seq-len", 16, "--batch-size", 2, "--run", "r", "--device", "cpu")
    assert code == 2 and "started on another device" in err and "device_kind 'cuda' -> 'cpu'" in err
    assert len(err.strip().splitlines()) == 1
    assert db.run_info("r")["status"] == "interrupted"


@pytest.mark.parametrize("model", ["tiny-llama", pytest.param("minilm", marks=SLOW)])
def test_staging_ahead_keeps_arrays_and_statistics_bit_identical(tmp_path, model, monkeypatch):
    """The GPU box's writer loop (batch k staged in a thread while k + 1 is captured, two sets
    of buffers in turn, chunks written by the writer pool: its rule's 2 threads here, and 8 as a
    16-core box would), forced on the CPU: the same bytes as the one-buffer loop."""
    cfg = _cfg(model, n_seqs=7, batch_size=2, capture=ALL)
    extract_run(Database(tmp_path), "plain", cfg, progress=False)
    monkeypatch.setenv("ATTNBASE_STAGE_AHEAD", "1")
    extract_run(Database(tmp_path), "ahead", cfg, progress=False)
    monkeypatch.setenv("ATTNBASE_WRITER_THREADS", "8")
    extract_run(Database(tmp_path), "pool8", cfg, progress=False)
    db = Database(tmp_path)
    a = RunStore(db.store_path("plain"), "a")
    for run in ("ahead", "pool8"):
        b = RunStore(db.store_path(run), "b")
        for name in a.stored_names():
            x, y = a.read(name), b.read(name)
            assert x.tobytes() == y.tobytes(), (run, name)
        ra, rb = _rows(db, "plain"), _rows(db, run)
        for col in ra:
            assert np.array_equal(ra[col], rb[col], equal_nan=True), (run, col)


def test_writer_pool_rule(monkeypatch):
    """The writer pool's size: 2 when staging waits for the forward (a CPU box) and on a
    2-core box either way; every core but one beside a GPU, at most 16; the override."""
    from attnbase.errors import WarehouseError
    from attnbase.runner import usable_cores, writer_threads

    monkeypatch.delenv("ATTNBASE_WRITER_THREADS", raising=False)
    assert [writer_threads(False, cores=c) for c in (1, 2, 16)] == [2, 2, 2]
    assert [writer_threads(True, cores=c) for c in (1, 2, 3, 16, 64)] == [2, 2, 2, 15, 16]
    assert 1 <= usable_cores() <= (__import__("os").cpu_count() or 1)
    monkeypatch.setenv("ATTNBASE_WRITER_THREADS", "5")
    assert writer_threads(False) == writer_threads(True) == 5
    monkeypatch.setenv("ATTNBASE_WRITER_THREADS", "0")
    with pytest.raises(WarehouseError, match="ATTNBASE_WRITER_THREADS='0' is not a thread count"):
        writer_threads(True)
