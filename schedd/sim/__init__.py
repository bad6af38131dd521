"""Trace replay on a virtual clock through the very `plan()` the live scheduler calls.

`schedctl sim` (cli.py) reads a trace (traces.py), replays it on simulated nodes
(engine.py) for each profile asked, and reports (metrics.py, report.py, plots.py).
Nothing here is imported by the live daemons; matplotlib is imported only to plot.
"""
