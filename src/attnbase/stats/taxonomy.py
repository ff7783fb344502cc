"""Head taxonomy: previous-token, duplicate-token and induction scores (docs/metrics.md §3b).

A = one head's attention probabilities of one window ``(query, key)``, t its token ids ``(pos,)``;
J_i = {j < i : t_j = t_i} (the earlier occurrences of query i's token):

- ``prev_token`` = mean over i >= 1 of A[i, i-1];
- ``duplicate_token`` = mean over the i with J_i non-empty of sum_{j in J_i} A[i, j];
- ``induction`` = mean over the same i of sum_{j in J_i} A[i, j+1] (the token that followed an
  earlier occurrence; Olsson et al. 2022, "In-context Learning and Induction Heads").

The means pool the qualifying rows of every window of the run (a window of ``probe:random``
without repeats adds no row to the last two). Every function takes attention ``(..., seq,
query, key)`` and tokens ``(seq, pos)`` and returns ``(...)``: one value per head. The analysis
streams a run's logits in chunks of windows and adds up :func:`taxonomy_sums` of each, so a
run's memory stays bounded by one chunk (``stats/layer_parts.py``).

TransformerLens's ``detect_head`` (``transformer_lens.head_detector``) scores the same three
patterns differently: it builds a 0/1 detection pattern per window, multiplies it into the
attention (for ``duplicate_token_head`` and ``induction_head`` the pattern marks every earlier
occurrence, as here), and divides the masked sum by the total attention of the window
(``exclude_bos``/``exclude_current_token`` options left aside), i.e. it averages over *all*
queries, including those with no earlier occurrence (which then count as zero). Our
duplicate/induction means run over the qualifying queries only, so a perfect head scores 1
whatever the share of repeated tokens; TL's score of the same head is that share.
"""

from __future__ import annotations

import numpy as np

__all__ = ["prev_token", "duplicate_token", "induction", "taxonomy_sums", "taxonomy_means"]


def _earlier(tokens: np.ndarray) -> np.ndarray:
    """``(seq, query, key)`` bool: key j < query i holds the query's token (J_i)."""
    t = np.asarray(tokens)
    same = t[:, :, None] == t[:, None, :]
    return same & np.tri(t.shape[1], k=-1, dtype=bool)


def taxonomy_sums(attn: np.ndarray, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Sums and counts behind the three means, for adding up over chunks of windows:
    ``prev`` and ``dup``, ``ind`` ``(...)`` sums of the scores, ``n_prev`` and ``n_dup`` the
    number of rows they run over (scalars)."""
    a = np.asarray(attn, dtype=np.float64)
    t = np.asarray(tokens)
    if a.shape[-3] != t.shape[0] or a.shape[-2] != t.shape[1] or a.shape[-1] != t.shape[1]:
        raise ValueError(f"attention {a.shape} (..., seq, query, key) does not match tokens "
                         f"{t.shape} (seq, pos)")
    dup_mask = _earlier(t)
    ind_mask = np.zeros_like(dup_mask)
    ind_mask[..., 1:] = dup_mask[..., :-1]  # key j + 1 for every j in J_i (j + 1 <= i)
    rows = dup_mask.any(-1)  # (seq, query): the queries whose token occurred earlier
    prev = np.diagonal(a, offset=-1, axis1=-2, axis2=-1).sum((-2, -1))
    dup = np.einsum("...sqk,sqk->...", a, dup_mask.astype(np.float64))
    ind = np.einsum("...sqk,sqk->...", a, ind_mask.astype(np.float64))
    return {"prev": prev, "n_prev": t.shape[0] * (t.shape[1] - 1), "dup": dup, "ind": ind,
            "n_dup": int(rows.sum())}


def taxonomy_means(sums: dict) -> dict[str, np.ndarray]:
    """``{"prev_token", "duplicate_token", "induction"}`` from (added-up) :func:`taxonomy_sums`;
    NaN where no row qualifies (one-token windows, or no token repeats)."""
    def mean(s, n):
        return np.asarray(s, dtype=np.float64) / n if n else np.full(np.shape(s), np.nan)

    return {"prev_token": mean(sums["prev"], sums["n_prev"]),
            "duplicate_token": mean(sums["dup"], sums["n_dup"]),
            "induction": mean(sums["ind"], sums["n_dup"])}


def prev_token(attn: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Previous-token score: mean over windows and queries i >= 1 of A[i, i-1]
    (docs/metrics.md §3b).

    Examples
    --------
    Uniform causal attention over 3 tokens: rows 1 and 2 give 1/2 and 1/3.

    >>> a = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    >>> round(float(prev_token(a[None], np.array([[5, 6, 7]]))), 6)
    0.416667
    """
    return taxonomy_means(taxonomy_sums(attn, tokens))["prev_token"]


def duplicate_token(attn: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Duplicate-token score: mean over the queries whose token occurred earlier of the
    attention on those earlier occurrences (docs/metrics.md §3b).

    Examples
    --------
    Tokens (7, 8, 7): only query 2 qualifies; uniform causal attention puts 1/3 on key 0.

    >>> a = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    >>> round(float(duplicate_token(a[None], np.array([[7, 8, 7]]))), 6)
    0.333333
    """
    return taxonomy_means(taxonomy_sums(attn, tokens))["duplicate_token"]


def induction(attn: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Induction score: mean over the same queries of the attention on the token after each
    earlier occurrence (docs/metrics.md §3b; Olsson et al. 2022).

    Examples
    --------
    Tokens (7, 8, 7): query 2 attending to key 1 (after the earlier 7) scores 1.

    >>> a = np.array([[[1, 0, 0], [0.5, 0.5, 0], [0, 1, 0]]], dtype=float)
    >>> float(induction(a, np.array([[7, 8, 7]])))
    1.0
    """
    return taxonomy_means(taxonomy_sums(attn, tokens))["induction"]
