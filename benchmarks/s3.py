"""Extraction to local disk vs to an S3 server on the same machine vs 2 Dask workers to S3.

One run of this script times, side by side and each in a fresh process, the same extraction
(GPT-2-small shape with seeded random weights, ``benchmarks/extract.py``'s model; full capture
``keys,queries,logits,hidden``):

* ``local``: ``attnbase extract --db D`` (chunks to ``D/runs``, the default);
* ``s3``: the same with ``--store s3://bench/runs`` against ``moto_server`` on 127.0.0.1;
* ``2 workers -> s3``: the extract flow with ``task_runner = "dask"``, ``workers = 2`` and the
  same store (each worker loads the model once; the flow process marks the ledger);

then the coordinator's catalog cost per batch: the time of one ledger mark
(``RunWriter.mark_batches``: open the catalog, one UPDATE transaction, close), over ``--marks``
marks, and from it the batch rate at which one coordinator would be the limit.

    HF_HUB_OFFLINE=1 python benchmarks/s3.py --seqs 150 --seq-len 128 --batch-size 8

Prints a Markdown table (paste into RESULTS.md). Wall times include each process's imports and
model load (the same in every column); moto keeps objects in memory (RSS grows with the run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto():
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe) if exe.exists() else "moto_server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(400):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto_server did not start")


def timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{cmd[:4]} failed: {r.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - t


FLOW = """
import json, sys
from attnbase.flows.extract import extract_flow
a = json.loads(sys.argv[1])
extract_flow(db=a["db"], run_id=a["run"], model=a["model"], seqs=a["seqs"], seq_len=a["seq_len"],
             batch_size=a["batch_size"], capture=a["capture"], device="cpu", task_runner="dask",
             workers=2, store=a["store"])
"""

MARKS = """
import sys, time, json
from attnbase.warehouse import Database
from attnbase.warehouse.runs.writer import RunWriter
a = json.loads(sys.argv[1])
db = Database(a["db"])
from attnbase.extract.config import ExtractConfig
row = db.run_info(a["run"])
w = RunWriter(db.path, db.lock_timeout, a["run"], None, (), True, str(row["created_at"]),
              row["store_url"])
n = a["marks"]
t = time.perf_counter()
for k in range(n):
    w.mark_batches([{"run_id": a["run"], "batch": k % a["n_batches"], "created_at": None}])
print(json.dumps({"mark_s": (time.perf_counter() - t) / n}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, default=150)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--capture", default="keys,queries,logits,hidden")
    ap.add_argument("--marks", type=int, default=50)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from extract import gpt2_small_dir  # benchmarks/extract.py

    work = Path(tempfile.mkdtemp(prefix="attnbase-s3bench-"))
    proc, ep = start_moto()
    try:
        env = {**os.environ, "AWS_ENDPOINT_URL": ep, "AWS_ACCESS_KEY_ID": "bench",
               "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        import boto3

        boto3.client("s3", endpoint_url=ep, aws_access_key_id="bench",
                     aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket="bench")
        model = str(gpt2_small_dir(work))
        db = str(work / "db")
        base = [sys.executable, "-m", "attnbase.cli", "extract", "--model", model, "--seqs",
                str(args.seqs), "--seq-len", str(args.seq_len), "--batch-size",
                str(args.batch_size), "--capture", args.capture, "--device", "cpu", "--db", db, "-q"]
        timed(base + ["--run", "warm", "--seqs", str(args.batch_size)], env)  # page cache, numba
        res = {"local": timed(base + ["--run", "local"], env),
               "s3": timed(base + ["--run", "s3", "--store", "s3://bench/runs"], env)}
        fa = {"db": db, "run": "dask", "model": model, "seqs": args.seqs, "seq_len": args.seq_len,
              "batch_size": args.batch_size, "capture": args.capture.split(","),
              "store": "s3://bench/runs"}
        res["2 workers -> s3"] = timed([sys.executable, "-c", FLOW, json.dumps(fa)], env)
        n_batches = -(-args.seqs // args.batch_size)
        r = subprocess.run([sys.executable, "-c", MARKS, json.dumps(
            {"db": db, "run": "s3", "marks": args.marks, "n_batches": n_batches})], env=env,
            capture_output=True, text=True, check=True)
        mark_s = json.loads(r.stdout.strip().splitlines()[-1])["mark_s"]
        size = sum(p.stat().st_size for p in (work / "db" / "runs" / "local").rglob("*") if p.is_file())
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)
    print(f"GPT-2-small shape, {args.seqs} x {args.seq_len}, batch {args.batch_size}, capture "
          f"{args.capture}; {n_batches} batches, {size / 2**20:.0f} MiB stored per run\n")
    print("| | " + " | ".join(res) + " |")
    print("|---|" + "---:|" * len(res))
    print("| wall s | " + " | ".join(f"{v:.1f}" for v in res.values()) + " |")
    print("| s per batch | " + " | ".join(f"{v / n_batches:.2f}" for v in res.values()) + " |")
    print(f"\ncoordinator: one ledger mark (catalog open + UPDATE + close) {mark_s * 1e3:.1f} ms "
          f"-> one coordinator is the limit above ~{1 / mark_s:.0f} batches/s; with batches of "
          f"{res['s3'] / n_batches:.2f} s per worker that is ~{(1 / mark_s) * res['s3'] / n_batches:.0f} workers")


if __name__ == "__main__":
    main()
