"""``attnbase study distances|reversal|clusters|entropy|prune``: the compositional studies.

docs/metrics.md §4-5. Each command stores one ``studies`` row (with its params) plus its result tables
and prints a short summary table; ``attnbase sql`` then answers questions about them.
"""

from __future__ import annotations

import time

import typer

from attnbase.commands.dbopt import db_option, open_database
from attnbase.formatting import fmt, fmt_p
from attnbase.metrics import S
from attnbase.stats.defaults import BOOT, MIN_CLUSTER_SHARE

#: The study results the commands print (attnbase/metrics.py).
R, C, E = S.reversal, S.clusters, S.entropy_change
_DB = db_option()


def _table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.table import Table

    from attnbase.commands.output import console

    tab = Table(title=title)
    for i, c in enumerate(columns):
        tab.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        tab.add_row(*(fmt(v) for v in r))
    console().print(tab)  # full width when piped


def _split(value: str | None, what: str) -> list[str]:
    from attnbase.errors import StatsError

    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    if not items:
        raise StatsError(f"{what} is empty; give a comma-separated list")
    return items


def ari_ci(res: dict, d: str) -> str:
    lo, hi = res.get(C.ari_ci_low(d)), res.get(C.ari_ci_high(d))
    return "—" if lo is None else f"{fmt(lo)} to {fmt(hi)}"


def register(study_app: typer.Typer) -> None:
    @study_app.command("distances")
    def distances(
        db: str = _DB,
        run: str = typer.Option(..., "--run", help="run id (needs attn_logits, stored or derived)"),
        min_query: int = typer.Option(2, "--min-query", help="shared rows use queries i >= this"),
        max_rows: int = typer.Option(None, "--max-rows", help="seeded subsample of the row set"),
        seed: int = typer.Option(0, "--seed", min=0),
        dissimilarities: str = typer.Option("cosine,js,euclidean,aitchison,aitchison_perp",
                                            "--dissimilarities"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
        no_progress: bool = typer.Option(False, "--no-progress", hidden=True,
                                         help="old spelling of --quiet"),
    ) -> None:
        """Head-to-head distances under with_sink and drop_sink (docs/metrics.md §5) -> head_distances."""
        import numpy as np

        from attnbase.stats import studies

        t0 = time.perf_counter()
        database = open_database(db)
        sid = studies.distances_study(
            database, run, dissimilarities=_split(dissimilarities, "--dissimilarities"),
            min_query=min_query, max_rows=max_rows, seed=seed, progress=not (quiet or no_progress))
        mats, heads = studies.load_distances(database, sid)
        rows = []
        for (d, c), m in sorted(mats.items()):
            off = m[~np.eye(len(m), dtype=bool)]
            rows.append([d, c, float(off.mean()), float(off.min()), float(off.max())])
        _, params = studies.find_study(database, "distances", run, sid)
        _table(f"head distances of {run} ({len(heads)} heads, {params['rows']} shared rows)",
               ["dissimilarity", "convention", "mean", "min", "max"], rows)
        dropped = studies.study_result(database, sid, S.distances.rows_without_sink_dropped)
        if dropped:
            typer.echo(f"{int(dropped)} positions left out: a sliding window masks their key 0")
        typer.echo(f"study {sid} in {time.perf_counter() - t0:.1f} s")

    @study_app.command("reversal")
    def reversal(
        db: str = _DB,
        run: str = typer.Option(..., "--run"),
        draws: int = typer.Option(50_000, "--draws", min=1, help="sampled triplets"),
        seed: int = typer.Option(0, "--seed", min=0),
        distances_id: str = typer.Option(None, "--distances", help="distances study (default: latest)"),
        sampled: bool = typer.Option(False, "--sampled", help="sample even when exact is cheap"),
        boot: int = typer.Option(BOOT, "--boot", min=2,
                                 help="bootstrap replicates over the run's sequences (the CI)"),
    ) -> None:
        """Share of head triplets whose verdict flips between conventions, with a 95% CI over
        the text (docs/metrics.md §5)."""
        from attnbase.stats import studies

        t0 = time.perf_counter()
        sid, res = studies.reversal_study(open_database(db), run, draws=draws, seed=seed,
                                          distances=distances_id, force_sampled=sampled,
                                          boot=boot)
        rows = [[d, res[R.reversal_rate(d)], res[R.reversal_ci_low(d)],
                 res[R.reversal_ci_high(d)], int(res[R.reversal_triplets(d)]),
                 "exact" if res[R.reversal_exact(d)] else "sampled"]
                for d in studies.COMPARED if R.reversal_rate(d) in res]
        _table(f"reversal rate of {run} (aitchison: d_A vs d_A_perp; 95% CI: {boot} resamples "
               "of the sequences)",
               ["dissimilarity", "rate", "ci_low", "ci_high", "triplets", "method"], rows)
        typer.echo(f"study {sid} in {time.perf_counter() - t0:.1f} s")

    @study_app.command("clusters")
    def clusters(
        db: str = _DB,
        run: str = typer.Option(..., "--run"),
        preset: str = typer.Option("all", "--preset", help="all | clark (JS, Clark et al. 2019)"),
        draws: int = typer.Option(999, "--draws", min=1, help="ARI permutation draws"),
        seed: int = typer.Option(0, "--seed", min=0),
        k_max: int = typer.Option(12, "--k-max", min=2),
        min_cluster_share: float = typer.Option(
            MIN_CLUSTER_SHARE, "--min-cluster-share", min=0.0, max=0.49,
            help="smallest admissible cluster: max(2, this share of the heads)"),
        boot: int = typer.Option(BOOT, "--boot", min=2,
                                 help="sequence resamples for the ARI's spread"),
        distances_id: str = typer.Option(None, "--distances", help="distances study (default: latest)"),
    ) -> None:
        """Average-linkage clusterings under both conventions, their ARI and MDS (docs/metrics.md §5)."""
        from attnbase.reports.sections_compositional import cluster_sizes
        from attnbase.stats import studies

        t0 = time.perf_counter()
        sid, res = studies.clusters_study(open_database(db), run, preset=preset, draws=draws,
                                          seed=seed, k_max=k_max, distances=distances_id,
                                          min_cluster_share=min_cluster_share, boot=boot)
        rows, refused = [], []
        for d in studies.PRESETS[preset]:
            if C.k(d) not in res:
                continue
            if res[C.k(d)] is None:
                refused.append(d)
                rows.append([d, "none", "—", "—", "—", "—", "—", "—"])
                continue
            rows.append([d, int(res[C.k(d)]), cluster_sizes(res, d), res[C.silhouette(d)],
                         res[C.ari(d)], ari_ci(res, d),
                         f"{fmt_p(res[C.ari_p(d)], draws=draws, at_floor=bool(res.get(C.ari_p_at_floor(d))))}"
                         f" ({int(res[C.ari_null_distinct(d)])} values)",
                         fmt_p(res[C.ari_p_normal(d)])])
        _table(f"clustering agreement of {run} (with_sink vs drop_sink)",
               ["dissimilarity", "k", "sizes", "silhouette", "ARI", "ARI 95% CI",
                "p (perm; null values)", "p (normal fit)"], rows)
        some = next(iter(res[k] for k in res if k.startswith(C.min_cluster(""))), None)
        if refused:
            typer.echo(f"no k in 2..{k_max} gives every cluster >= {int(some)} heads for "
                       f"{', '.join(refused)}: no clustering to compare, no ARI")
        from attnbase.stats import convention as cv

        typer.echo(f"p (normal fit) only where the permutation null took >= "
                   f"{cv.NORMAL_FIT_MIN_DISTINCT} distinct values, none holding > "
                   f"{cv.NORMAL_FIT_MAX_TIE:.0%} of the draws")
        typer.echo(f"study {sid} in {time.perf_counter() - t0:.1f} s")

    @study_app.command("entropy")
    def entropy(
        db: str = _DB,
        runs: str = typer.Option(None, "--runs", help="two runs on the same windows: A,B"),
        run: str = typer.Option(None, "--run", help="one run, with --layers a,b"),
        layers: str = typer.Option(None, "--layers", help="two layers of --run: a,b"),
        min_query: int = typer.Option(2, "--min-query"),
    ) -> None:
        """Exact split of the entropy change a -> b into sink and content parts (docs/metrics.md §4)."""
        from attnbase.errors import StatsError
        from attnbase.stats import entropy_study

        if runs and (run or layers):
            raise StatsError("give either --runs A,B or --run R --layers a,b, not both")
        if runs:
            pair = _split(runs, "--runs")
            if len(pair) != 2:
                raise StatsError(f"--runs takes two runs A,B; got {len(pair)}")
            sid, res = entropy_study.entropy_study(open_database(db), runs=tuple(pair),
                                                   min_query=min_query)
        elif run and layers:
            ab = _split(layers, "--layers")
            if len(ab) != 2 or not all(x.lstrip("-").isdigit() for x in ab):
                raise StatsError(f"--layers takes two layer indices a,b; got {layers!r}")
            sid, res = entropy_study.entropy_study(open_database(db), run=run,
                                                   layers=(int(ab[0]), int(ab[1])),
                                                   min_query=min_query)
        else:
            raise StatsError("study entropy needs --runs A,B or --run R --layers a,b")
        rows = [[str(k), v[E.d_entropy], v[E.sink_part], v[E.content_part], v[E.sink_share]]
                for k, v in res.items()]
        _table("entropy change (nats; sink share = sink part / dH)",
               ["layer", "dH", "sink part", "content part", "sink share"], rows)
        typer.echo(f"study {sid}")

    @study_app.command("prune")
    def prune(
        db: str = _DB,
        run: str = typer.Option(..., "--run", help="run whose head distances rank the heads"),
        model: str = typer.Option(None, "--model", help="the model to prune (default: the "
                                  "run's own, as the catalog records it)"),
        fractions: str = typer.Option("0.1,0.2,0.3", "--fractions"),
        rankings: str = typer.Option("js,aitchison,aitchison_perp", "--rankings"),
        convention: str = typer.Option("with_sink", "--convention",
                                       help="convention of the js/aitchison rankings"),
        eval_seqs: int = typer.Option(16, "--eval-seqs", min=1, help="held-out windows"),
        seeds: int = typer.Option(5, "--random-seeds", min=1, help="random-ranking baselines"),
        device: str = typer.Option("auto", "--device"),
        distances_id: str = typer.Option(None, "--distances"),
    ) -> None:
        """Mask the most redundant heads; perplexity (embedding cosine for encoders, top-1
        agreement for image classifiers) on held-out windows or images."""
        from attnbase.studies.prune import prune_study

        t0 = time.perf_counter()
        sid, table, metric = prune_study(
            open_database(db), run, model,
            fractions=[float(f) for f in _split(fractions, "--fractions")],
            rankings=_split(rankings, "--rankings"), convention=convention, eval_seqs=eval_seqs,
            random_seeds=seeds, device=device, distances=distances_id)
        held = "images" if metric == "top-1 agreement" else "windows"
        _table(f"pruning {run}: {metric} on {eval_seqs} held-out {held}",
               ["ranking", *[f"{f:.0%}" for f in table["fractions"]]],
               [[name, *vals] for name, vals in table["rows"].items()])
        typer.echo(f"unpruned {metric}: {fmt(table['base'])}; study {sid} in "
                   f"{time.perf_counter() - t0:.1f} s")
