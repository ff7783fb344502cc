"""obstore vs s3fs against a moto S3 server on 127.0.0.1: PUT and GET of N x 1 MiB objects.

What chose obstore for the run stores' bytes (warehouse/runs/location.py); s3fs stays as the fsspec
file system DuckDB reads statistics files through.

    python benchmarks/object_clients.py --n 200 --reps 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s3 import start_moto  # noqa: E402  (benchmarks/s3.py)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    proc, ep = start_moto()
    try:
        import boto3
        import obstore
        import s3fs
        from obstore.store import S3Store

        os.environ.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1")
        boto3.client("s3", endpoint_url=ep, region_name="us-east-1").create_bucket(Bucket="bench")
        blobs = [np.random.default_rng(i).bytes(1 << 20) for i in range(args.n)]
        fs = s3fs.S3FileSystem(endpoint_url=ep, skip_instance_cache=True)
        st = S3Store("bench", endpoint=ep, region="us-east-1", client_options={"allow_http": True})
        print(f"{args.n} x 1 MiB, moto on loopback; seconds per pass")
        print("| rep | PUT s3fs pipe(dict) | PUT obstore x threads | PUT obstore async | "
              "GET s3fs cat(list) | GET obstore x threads |")
        print("|---|---:|---:|---:|---:|---:|")
        for rep in range(args.reps):
            t = time.perf_counter()
            fs.pipe({f"bench/s3fs{rep}/{i}": b for i, b in enumerate(blobs)})
            a = time.perf_counter() - t
            t = time.perf_counter()
            with ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(lambda ib: obstore.put(st, f"ob{rep}/{ib[0]}", ib[1]), enumerate(blobs)))
            b = time.perf_counter() - t

            async def puts():
                await asyncio.gather(*[obstore.put_async(st, f"oba{rep}/{i}", x)
                                       for i, x in enumerate(blobs)])

            t = time.perf_counter()
            asyncio.run(puts())
            c = time.perf_counter() - t
            t = time.perf_counter()
            fs.cat([f"bench/s3fs{rep}/{i}" for i in range(args.n)])
            d = time.perf_counter() - t
            t = time.perf_counter()
            with ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(lambda i: bytes(obstore.get(st, f"ob{rep}/{i}").bytes()), range(args.n)))
            e = time.perf_counter() - t
            print(f"| {rep} | {a:.2f} | {b:.2f} | {c:.2f} | {d:.2f} | {e:.2f} |")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


if __name__ == "__main__":
    main()
