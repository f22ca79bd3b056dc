"""Sweeps: a grid of ordinary profiles run side by side on Dask, then fitted.

``spec``: what to run (kernel, versions, grid axes, profiling options) and the points.
``point``: one point, run on a worker as ``python -m app.kernel ...`` (the CLI's own path).
``engine``: the cluster (Dask local, local-cuda, a scheduler address, or sequential),
retries, progress, Ctrl-C.
``results``: results.csv, one row per point, and what --resume reads back.
``scaling``: log-log exponents with intervals, best version per size, crossovers.
``report``: report.md, scaling.png, speedup.png.
"""
