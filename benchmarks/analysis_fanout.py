"""Analysis of one run: single-process ``analyze_run`` vs the analyze flow on 2 Dask workers.

Each measurement is a fresh process (imports included), rounds interleaved:

* ``one process``: ``analyze_run(db, run)`` (threads over the kv heads of a layer, one layer
  read ahead), as ``attnbase analyze`` runs it;
* ``2 workers``: ``analyze_flow(task_runner="dask", workers=2)``: a LocalCluster of 2 worker
  processes, one task per layer (keys, attention aggregates and depth of that layer), the parts
  combined and written by the flow process. Its wall time includes Prefect's ephemeral server
  and the cluster's start, reported apart (``flow s`` = the whole flow call, ``in tasks`` = the
  sum of the layer tasks' compute time on the workers).

After each 2-worker round the result tables are compared with the single-process ones (every
row equal). ``--store s3://...`` is not offered: run the run's extraction with a store and pass
its run id (the jobs read wherever the catalog says the run lives).

    HF_HUB_OFFLINE=1 python benchmarks/analysis_fanout.py --db D --run R [--repeat 2]
        [--extract minilm --seqs 64 --seq-len 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TABLES = ("head_metrics", "null_tests", "layer_metrics", "run_metrics")

CHILD_ONE = """
import json, sys, time
t0 = time.perf_counter()
from attnbase.stats.analyze import analyze_run
from attnbase.warehouse import Database
t1 = time.perf_counter()
analyze_run(Database(sys.argv[1]), sys.argv[2], draws=int(sys.argv[3]))
print(json.dumps({"imports": t1 - t0, "analysis": time.perf_counter() - t1}))
"""

CHILD_DASK = """
import json, sys, time
t0 = time.perf_counter()
from attnbase.flows.serving import prepare_environment
prepare_environment(server=False)
from attnbase.flows import analyze_flow
t1 = time.perf_counter()
out = analyze_flow(db=sys.argv[1], run_id=sys.argv[2], draws=int(sys.argv[3]), task_runner="dask",
                   workers=2)
print(json.dumps({"imports": t1 - t0, "analysis": time.perf_counter() - t1,
                  "in_tasks": out[0]["worker_seconds"], "write": out[0]["write_seconds"]}))
"""


def child(code: str, db: str, run: str, draws: int) -> dict:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, db, run, str(draws)], capture_output=True,
                       text=True, env={**os.environ, "PREFECT_LOGGING_LEVEL": "ERROR"})
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall"] = time.perf_counter() - t
    return out


def snapshot(db: str, run: str) -> dict:
    from attnbase.warehouse import read_sql

    return {t: read_sql(db, f"SELECT * EXCLUDE (run_id) FROM {t} WHERE run_id = ? ORDER BY ALL",
                        [run]) for t in TABLES}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--extract", help="model to extract the run with first, if it is missing")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    a = ap.parse_args()
    db = str(Path(a.db).resolve())
    if a.extract and not (Path(db) / "runs" / a.run).exists():
        subprocess.run([sys.executable, "-m", "attnbase.cli", "extract", "--db", db, "--run",
                        a.run, "--model", a.extract, "--seqs", str(a.seqs), "--seq-len",
                        str(a.seq_len), "-q"], check=True)
    rows: dict[str, list[dict]] = {"one process": [], "2 workers": []}
    same = []
    for _ in range(a.repeat):
        rows["one process"].append(child(CHILD_ONE, db, a.run, a.draws))
        ref = snapshot(db, a.run)
        rows["2 workers"].append(child(CHILD_DASK, db, a.run, a.draws))
        fan = snapshot(db, a.run)
        same.append(all(ref[t].equals(fan[t]) for t in TABLES))
    from attnbase.warehouse import Database

    info = Database(db).run_info(a.run)
    print(f"{info['model']} {info['n_seqs']} x {info['seq_len']}, {info['n_layers']} layers, "
          f"draws {a.draws}, {os.cpu_count()} CPUs, medians of {a.repeat}; rows equal: {same}")
    print(json.dumps(rows))
    print("| | wall s (process) | analysis s (after imports) | in tasks s | write s |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in rows.items():
        med = {k: statistics.median([r[k] for r in rs]) for k in rs[0]}
        print(f"| {name} | {med['wall']:.2f} | {med['analysis']:.2f} | "
              f"{med.get('in_tasks', float('nan')):.2f} | {med.get('write', float('nan')):.2f} |")


if __name__ == "__main__":
    main()
