"""The pruning study (``attnbase study prune``): rank heads by redundancy, mask them through the model, score held-out windows.

docs/metrics.md §5 (pruning); Papamichalis & Ruane report Llama-3.2-1B going from 15.3 to 2094
perplexity when the heads ranked redundant by JS are masked, while the d_A_perp ranking stays
stable. This module only glues the stages: the ranking is :func:`attnbase.stats.convention.
redundancy` over a stored distances study, the masking :func:`attnbase.extract.surgery.head_mask`,
the windows the corpus's windows that the run did not use (never used to rank heads).

Rankings (``--rankings``): ``js`` and ``aitchison`` under ``--convention`` (default with_sink),
``aitchison_perp`` (sink dropped by definition), any other stored dissimilarity, and the
``random`` baseline (``random_seeds`` seeded permutations, mean and sd). Scores: perplexity for
causal LMs; for encoders the mean cosine similarity of each window's pooled embedding to the
unpruned one; for image classifiers (the paper's ViT-B/16) the top-1 agreement with the unpruned
model's predictions on held-out images (:func:`held_out_images`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from attnbase.errors import StatsError
from attnbase.formatting import fmt
from attnbase.metrics import S

if TYPE_CHECKING:
    from attnbase.warehouse import Database


def held_out_windows(db: Database, run_id: str, lm, n: int, seed: int = 0) -> np.ndarray:
    """``n`` windows of the run's corpus and length that the run itself did not use."""
    from attnbase.extract import corpus_windows
    info = db.run_info(run_id)
    used = db.run(run_id).store().read("tokens")
    bos = json.loads(info.get("config") or "{}").get("bos", "auto")  # the run's own position 0
    probe = corpus_windows(lm, info["corpus"], 1, int(info["seq_len"]), seed=0, bos=bos)
    every = corpus_windows(lm, info["corpus"], probe.n_available, int(info["seq_len"]), seed=0,
                           bos=bos)
    if every.corpus_hash != info["corpus_hash"]:
        raise StatsError(f"corpus {info['corpus']!r} changed since run {run_id!r} was extracted "
                         f"(hash {every.corpus_hash} vs {info['corpus_hash']}); held-out windows "
                         "cannot be chosen")
    seen = {r.tobytes() for r in used.astype(np.int32)}
    free = np.array([i for i, r in enumerate(every.tokens) if r.tobytes() not in seen])
    if len(free) < n:
        raise StatsError(f"only {len(free)} windows of corpus {info['corpus']!r} are not in run "
                         f"{run_id!r}; lower --eval-seqs")
    pick = np.sort(np.random.default_rng(seed).choice(free, size=n, replace=False))
    return every.tokens[pick]


def run_sources(db: Database, run_id: str) -> list:
    """The run's windows as :class:`attnbase.extract.vision.Source` (``seq_sources``)."""
    from attnbase.extract.vision import Source

    with db.connect(read_only=True) as con:
        rows = con.execute("SELECT source, x0, y0, x1, y1 FROM seq_sources WHERE run_id = ? "
                           "ORDER BY seq", [run_id]).fetchall()
    return [Source(r[0], tuple(int(v) for v in r[1:])) for r in rows]


def held_out_images(db: Database, run_id: str, lm, n: int, seed: int = 0):
    """``(pixels, sources)`` of ``n`` images of the run's corpus that the run did not use."""
    from attnbase.extract import vision

    info = db.run_info(run_id)
    used = run_sources(db, run_id)
    if not used:
        raise StatsError(f"run {run_id!r} records no image sources (seq_sources); it is not an "
                         "image run")
    _, images = vision.corpus_sources(info["corpus"], 0, 0)
    if vision.corpus_digest(info["corpus"], images, lm.processor) != info["corpus_hash"]:
        raise StatsError(f"corpus {info['corpus']!r} or the model's processor changed since run "
                         f"{run_id!r} was extracted; held-out images cannot be chosen")
    return vision.held_out(lm, info["corpus"], used, n, seed)


def _ranking(mats, heads, name: str, conv: str) -> list[tuple[int, int]]:
    from attnbase.stats.convention import redundancy

    c = "drop_sink" if name == "aitchison_perp" else conv
    if (name, c) not in mats:
        raise StatsError(f"the distances study has no {name}/{c}; choose from "
                         f"{', '.join(sorted({d for d, _ in mats}))} or random")
    r = redundancy(mats[(name, c)])
    order = np.argsort(r, kind="stable")  # most redundant (nearest neighbour closest) first
    return [tuple(int(v) for v in heads[k]) for k in order]


def prune_study(db: Database, run_id: str, model: str | None = None, *, fractions=(0.1, 0.2, 0.3),
                rankings=("js", "aitchison", "aitchison_perp"), convention: str = "with_sink",
                eval_seqs: int = 16, random_seeds: int = 5, device: str = "auto",
                distances: str | None = None, batch_size: int = 8):
    """Run the pruning study; returns ``(study_id, table, metric)``. ``model`` None: the run's
    own model, as the catalog records it.

    ``table = {"fractions": [...], "base": unpruned score, "rows": {ranking: [scores...]}}`` with
    ``random`` as ``"mean +- sd"`` strings and ``random_mean``/``random_sd`` rows in the catalog.
    """
    from attnbase.extract import load_model
    from attnbase.extract.surgery import (head_mask, lm_head, perplexity, pooled_embeddings,
                                          predictions)
    from attnbase.stats import studies

    info = db.run_info(run_id)
    model = info["model"] if model is None else model
    src, src_params = studies.find_study(db, "distances", run_id, distances)
    mats, heads = studies.load_distances(db, src)
    lm = load_model(model, dtype="float32", device=device, attn_implementation="sdpa")
    if (lm.info.n_layers, lm.info.n_heads) != (info["n_layers"], info["n_heads"]):
        raise StatsError(f"model {model!r} has {lm.info.n_layers}x{lm.info.n_heads} heads but run "
                         f"{run_id!r} was extracted from {info['model']!r} "
                         f"({info['n_layers']}x{info['n_heads']}); pass the run's model")
    causal = lm.info.causal
    if lm.processor is not None:  # an image classifier: top-1 agreement with the unpruned model
        pixels, _ = held_out_images(db, run_id, lm, eval_seqs)
        metric, key = "top-1 agreement", S.prune.top1
        ref_pred = predictions(lm, pixels)

        def score(masked):
            with head_mask(lm, masked):
                return float((predictions(lm, pixels) == ref_pred).mean())
    elif causal:
        tokens = held_out_windows(db, run_id, lm, eval_seqs)
        head = lm_head(lm, model)
        metric = "perplexity"

        def score(masked):
            with head_mask(lm, masked):
                return perplexity(lm, tokens, batch_size=batch_size, head=head)
    else:
        tokens = held_out_windows(db, run_id, lm, eval_seqs)
        metric = "pooled-embedding cosine"
        ref = pooled_embeddings(lm, tokens)

        def score(masked):
            with head_mask(lm, masked):
                e = pooled_embeddings(lm, tokens)
            cos = (e * ref).sum(1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))
            return float(cos.mean())

    n_total = len(heads)
    base = score([])
    if lm.processor is None:
        key = S.prune.ppl if causal else S.prune.cos
    sd_key = getattr(S.prune, f"{key}_sd")
    results: dict[str, float] = {key("none"): base}
    rows: dict[str, list] = {}
    for name in rankings:
        if name == "random":
            continue
        order = _ranking(mats, heads, name, convention)
        vals = []
        for f in fractions:
            v = score(order[: int(round(f * n_total))])
            results[key(name, f"{f:g}")] = v
            vals.append(v)
        rows[name] = vals
    rand_rows = []
    for f in fractions:
        k = int(round(f * n_total))
        draws = [score([tuple(int(x) for x in heads[j]) for j in
                        np.random.default_rng(s).permutation(n_total)[:k]])
                 for s in range(random_seeds)]
        mu, sd = float(np.mean(draws)), float(np.std(draws, ddof=1)) if len(draws) > 1 else 0.0
        results[key("random", f"{f:g}")] = mu
        results[sd_key("random", f"{f:g}")] = sd
        rand_rows.append(f"{fmt(mu, 4, style='plain')} +- {fmt(sd, 2, style='plain')}")
    rows["random"] = rand_rows
    params = {"distances": src, "model": model, "fractions": list(fractions),
              "rankings": list(rankings), "convention": convention, "eval_seqs": eval_seqs,
              "random_seeds": random_seeds, "metric": metric, "n_heads": n_total,
              "rows": src_params.get("rows")}
    sid = studies.write_study(db, "prune", [run_id], params, results)
    return sid, {"fractions": list(fractions), "base": base, "rows": rows}, metric
