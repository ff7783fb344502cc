"""The service's check of the statistics files it reads: each file's CRC-32C against the
catalog's, once per version of the file.

A byte flipped inside a Parquet data page can decode to a different number with no error, so
a reader that trusts the bytes answers wrong without a word. The catalog lists every statistics
file with its size and checksum (:mod:`attnbase.warehouse.catalog.statledger`); before a request
reads statistics, :class:`FileCheck` looks at each listed file of the local runs (one ``stat``)
and checksums it when its path, size or mtime is new to it, so a file is read whole once per
change, not once per query. A file whose size or checksum differs from the catalog's is
damaged: the views leave it out and fail its run's questions in one line naming the file and
``attnbase verify`` (:func:`attnbase.warehouse.runs.statfiles.stat_views`); questions that rule
the run out still answer. A missing file is the views' own case and is not reported here.

A file's mtime has the file system's clock granularity (a few ms, or coarser), so two writes
close together can leave the same mtime: a checksum taken within :data:`RACY_NS` of the file's
mtime is not kept, and the file is read again at its next request (as git treats a "racily
clean" file). A change that keeps a file's size and mtime (a byte rewritten and the mtime set
back) is not seen until the file changes again; ``attnbase verify`` reads every byte.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from attnbase.warehouse.catalog.statledger import damaged_file_error

#: A checksum taken less than this long after the file's mtime is not kept (see the module).
RACY_NS = 1_000_000_000

#: One listed file: ``(run_id, table, path relative to DIR, recorded crc32c, recorded size)``.
Listed = tuple[str, str, str, int, int]

#: The catalog's list of the local runs' statistics files, as :class:`Listed` rows.
LISTED_SQL = ("SELECT s.run_id, s.table_name, s.path, s.crc32c, s.size FROM stat_files s "
              "JOIN runs r USING (run_id) WHERE r.store_url IS NULL ORDER BY s.path")


#: Bytes read at a time: a file's checksum holds this much of it in memory, not the file.
READ_BYTES = 1 << 20


def file_crc32c(path: Path) -> int:
    """CRC-32C of a file's bytes (as :func:`attnbase.warehouse.runs.handle.crc32c` of them),
    read :data:`READ_BYTES` at a time."""
    import google_crc32c

    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            crc = google_crc32c.extend(crc, chunk)
    return int(crc)


class FileCheck:
    """Checksums of the files under ``root`` (the database directory), each computed once per
    ``(path, size, mtime)``; :meth:`damaged` answers from them."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._seen: dict[str, tuple[int, int, int]] = {}  # path -> (size, mtime_ns, crc32c)
        self._lock = threading.Lock()  # guards _locks
        self._locks: dict[str, threading.Lock] = {}  # path -> its reader's lock
        self.checksummed = 0  # files read whole so far

    def _crc(self, path: Path, st: os.stat_result) -> int:
        key = str(path)
        seen = self._seen.get(key)
        if seen is not None and seen[:2] == (st.st_size, st.st_mtime_ns):
            return seen[2]
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one reader per file (concurrent requests for it wait for that one)
            seen = self._seen.get(key)
            if seen is not None and seen[:2] == (st.st_size, st.st_mtime_ns):
                return seen[2]
            checked_at = time.time_ns()
            crc = file_crc32c(path)
            if checked_at - st.st_mtime_ns > RACY_NS:
                self._seen[key] = (st.st_size, st.st_mtime_ns, crc)
            else:
                self._seen.pop(key, None)
            self.checksummed += 1
            return crc

    def damaged(self, files: list[Listed]) -> dict[str, str]:
        """Relative path -> one-line message (naming the run, the file and ``attnbase
        verify``) for each of ``files`` whose bytes differ from the catalog's record."""
        out: dict[str, str] = {}
        for run_id, table, rel, want_crc, want_size in files:
            path = self.root / rel
            try:
                st = path.stat()
                if st.st_size != want_size:
                    what = f"has {st.st_size} bytes, the catalog recorded {want_size}"
                else:
                    crc = self._crc(path, st)
                    if crc == want_crc:
                        continue
                    what = (f"fails its checksum (crc32c {crc:08x}, the catalog recorded "
                            f"{want_crc:08x})")
            except FileNotFoundError:
                continue  # the views' own case (statfiles.stat_views)
            out[rel] = str(damaged_file_error(ValueError(what), rel))
        return out


def damaged_in(snap, check: FileCheck, paths=None) -> dict[str, str]:
    """:meth:`FileCheck.damaged` of the files snapshot ``snap`` lists (those of ``paths`` only,
    if given); the list is read once per snapshot and kept on it (beside its memo, whose
    entries stay the pages')."""
    files = getattr(snap, "stat_files_listed", None)
    if files is None:  # two first requests may both read it: the same list
        con = snap.cursor()
        if con is None:  # superseded and deleted meanwhile: nothing it lists is read
            return {}
        try:
            files = [tuple(r) for r in con.execute(LISTED_SQL).fetchall()]
        finally:
            con.close()
            snap.done()
        snap.stat_files_listed = files
    if paths is not None:
        wanted = set(paths)
        files = [f for f in files if f[2] in wanted]
    return check.damaged(files)
