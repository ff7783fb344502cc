"""Defaults of the statistics that several entry points share (CLI, flows, pipeline TOML).

Kept free of imports so that light modules (the pipeline's TOML validation) can read them.
"""

#: Draws of each head's mean VE@8 under each null for the empirical p-value (METRICS.md §8);
#: the CLT p-value does not depend on it.
NULL_DRAWS = 200
