"""A writer beside the service: ``python writer_child.py DB SECONDS HOLD_S``.

Commits one transaction after another into ``DB``'s catalog for SECONDS, each holding the file
for HOLD_S (DuckDB: one writing process at a time) and releasing it for 20 ms between; prints
the number of transactions committed.
"""

import sys
import time

from attnbase.warehouse import Database

db, seconds, hold = Database(sys.argv[1], lock_timeout=30), float(sys.argv[2]), float(sys.argv[3])
print("ready", flush=True)
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:
    with db.transaction() as con:
        con.execute("INSERT INTO run_metrics VALUES ('writer-probe', 'probe', ?)", [float(n)])
        time.sleep(hold)
    n += 1
    time.sleep(0.02)
print(n, flush=True)
