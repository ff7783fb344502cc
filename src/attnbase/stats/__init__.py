"""stats: the statistics of docs/metrics.md as pure numpy functions, one module per family.

``norms`` (§1), ``geometry`` (§2), ``concentration`` (§3), ``inference`` (§8), ``registry`` (every
statistic with its properties), ``queries`` / ``views`` (catalog SQL), ``analyze`` (a run's
collapse signature into the catalog). Nothing is imported here: ``import attnbase.stats.norms``.
"""
