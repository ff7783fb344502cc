"""Run storage: where one run's bytes live and how they are written, read and checked.

A run's bytes are its Zarr v3 store and its statistics files (``row_stats``/``col_stats``, one
Parquet file per batch). :mod:`.location` turns a store argument into a place (a directory or an
``s3://`` prefix), :mod:`.handle` is the one resolver of a run's places, :mod:`.store` the Zarr
store, :mod:`.statfiles` / :mod:`.statschema` the statistics files, :mod:`.writer` the one write
path, :mod:`.reader` / :mod:`.decoded` / :mod:`.derived` the read side, and :mod:`.verify`,
:mod:`.compact`, :mod:`.statcompact` the maintenance commands over a run.
"""
