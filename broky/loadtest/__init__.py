"""Load generation for ``broky bench`` and ``benchmarks/``: scenarios, load
generators (one process each), peers for ``--compare``, HDR histograms, plots."""
