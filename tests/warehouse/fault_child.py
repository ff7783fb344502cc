"""A writer process for the fault tests: ``python fault_child.py DB RUN N_SEQS BATCH [PAUSE_S]``.

Extracts fake batches (tests/warehouse/fakes.py) through the real write path
(:func:`attnbase.runner.ingest_batches`, background writes on). The fake source calls
``faults.point("batch_start")`` / ``("after_forward")`` around each batch exactly where
``extract.capture_batches`` calls them around its forward, so ``ATTNBASE_KILL_AT`` reaches every
point of ``faults.POINTS`` without loading a model. ``PAUSE_S`` sleeps before each batch (for
the concurrent-reader test). ``ATTNBASE_TEST_WAIT=1``: wait for another writer of the run
instead of refusing. Prints the batches it wrote; an attnbase error is one line on stderr and
exit 2, as the CLI does.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakes import fake_config, fake_info, make_batch  # noqa: E402

from attnbase import faults  # noqa: E402
from attnbase.warehouse import Database  # noqa: E402
from attnbase.runner import ingest_batches  # noqa: E402


def config(n_seqs: int, batch: int):
    return fake_info(rotary=True, n_kv_heads=1), fake_config(n_seqs=n_seqs, batch_size=batch)


def main() -> None:
    db, run, n_seqs, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    pause = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    info, cfg = config(n_seqs, batch)
    n_batches = -(-n_seqs // batch)

    def batches(start: int):
        for k in range(start, n_batches):
            time.sleep(pause)
            faults.point("batch_start")
            cb = make_batch(info, cfg, k)
            faults.point("after_forward")
            yield cb

    from attnbase.errors import AttnbaseError

    try:
        rec = ingest_batches(Database(db), run, cfg, info=info, corpus="default",
                             corpus_hash="c0", batches=batches, progress=False,
                             wait=os.environ.get("ATTNBASE_TEST_WAIT") == "1")
    except AttnbaseError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    print(f"written {rec.batches_written}")


if __name__ == "__main__":
    main()
