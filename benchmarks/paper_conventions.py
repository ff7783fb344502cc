"""The r-conventions table of docs/paper-conventions.md, from a database's studies.

    python benchmarks/paper_conventions.py --db DB minilm smollm2-auto smollm2-none ...

Prints one Markdown table: a row per (norm-CV variant, share variant, pairing), a column per run
(its latest ``r_conventions`` study, ``attnbase study r-conventions``): r with its 95% BCa CI,
and a star where the CI excludes 0. Then the runs' position 0 (runs.sink_token).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnbase.warehouse import Database

SQL = """
SELECT s.study_id, s.created_at, r.key, r.value
FROM studies s JOIN study_results r USING (study_id)
WHERE s.kind = 'r_conventions' AND list_contains(s.run_ids, ?)
ORDER BY s.created_at DESC
"""


def study_table(con, run: str) -> dict[tuple[str, str, str], dict[str, float]]:
    rows = con.execute(SQL, [run]).fetchall()
    if not rows:
        raise SystemExit(f"no r_conventions study of run {run!r}; run "
                         f"`attnbase study r-conventions --run {run}` first")
    latest = rows[0][0]
    out: dict = {}
    for sid, _, key, value in rows:
        if sid != latest:
            continue
        combo, stat = key.rsplit(":", 1)
        out.setdefault(tuple(combo.split("|")), {})[stat] = value
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args(argv)
    with Database(args.db).connect(read_only=True) as con:
        tables = {run: study_table(con, run) for run in args.runs}
        sinks = {run: con.execute("SELECT sink_token, model, json_extract_string(config, '$.bos') "
                                  "FROM runs WHERE run_id = ?", [run]).fetchone()
                 for run in args.runs}
    combos = sorted({c for t in tables.values() for c in t},
                    key=lambda c: (c[2] != "query_head", c[0], c[1]))
    print("| norm-CV | share | pairing | " + " | ".join(args.runs) + " |")
    print("|---|---|---|" + "---|" * len(args.runs))
    for combo in combos:
        cells = []
        for run in args.runs:
            s = tables[run].get(combo)
            if s is None:
                cells.append("")
                continue
            star = "*" if s["ci_low"] > 0 or s["ci_high"] < 0 else ""
            cells.append(f"{s['r']:+.2f}{star} [{s['ci_low']:+.2f}, {s['ci_high']:+.2f}]")
        print(f"| {combo[0]} | {combo[1]} | {combo[2]} | " + " | ".join(cells) + " |")
    print()
    print("position 0 (runs.sink_token): " + "; ".join(
        f"{run} {sinks[run][0] or '-'} (bos {sinks[run][2] or 'auto'})" for run in args.runs))
    print(json.dumps({run: sinks[run][1] for run in args.runs}))


if __name__ == "__main__":
    main()
