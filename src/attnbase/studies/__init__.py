"""Studies: the analyses over stored runs that the CLI (``attnbase study <kind>``, ``attnbase
weights``, ``attnbase demo``) and the pipeline's ``studies = [...]`` key both run.

The layer sits below the commands and the flows and above the stages it joins: a study reads a
run through the warehouse, scores it with :mod:`attnbase.stats` and, where it needs a model
(pruning, the weights-only S-D metrics), loads one through :mod:`attnbase.extract`. The commands
parse options, call a study and print; the flows call the same functions by kind
(:mod:`attnbase.studies.kinds`).

- :mod:`~attnbase.studies.kinds`: every study kind by name, with the defaults both callers use
- :mod:`~attnbase.studies.prune`: head pruning by redundancy, scored on held-out windows or images
- :mod:`~attnbase.studies.paths`: rank collapse of attention products along random paths
- :mod:`~attnbase.studies.weights`: a weights-only run with the S-D metrics of every head
"""
