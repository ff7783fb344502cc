"""Defaults of the statistics that several entry points share (CLI, flows, pipeline TOML).

Kept free of heavy imports so that light modules (the pipeline's TOML validation) can read them.
"""

from attnbase.options import NULL_DRAWS  # noqa: F401  declared with the analysis options

#: Clusters (docs/metrics.md §5): the smallest cluster of a partition that k may be chosen from
#: holds at least max(2, this share of the heads); a 71 + 1 split is an outlier, not a clustering.
MIN_CLUSTER_SHARE = 0.05

#: Bootstrap replicates over a run's sequences: the reversal rate's CI and the ARI's spread.
BOOT = 200

#: Gu et al. (ICLR 2025) Sink_1^eps: a head is a sink head when its mean attention on key 0 (over
#: windows and every query) exceeds eps (docs/metrics.md §3b, ``sink_rate``).
SINK_EPS = 0.3
