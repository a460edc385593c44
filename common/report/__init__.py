"""Scaling report: turn a directory of twinbench results JSONs into a comparison of the backends
(``python -m common.report``: common.report.cli).

Modules, in the order the report is made: load (files -> typed records, the versions compared; the jobs selected),
summary (a job's rows and their figures, speedups, the ratio of each compared backend pair), notes (the notes the
records give, as prose), stats (medians, intervals, the bootstrap), verdict (per pair which backend is faster, best
vs best), migrate (leaving Horovod for native), baseline (``--baseline``), converge (``--until``), machines (the
machines and the environment), model (allreduce benchmark, scaling model, breakdown), document (what the report says,
once), render (report.md, report.html, report.csv and the plots), build (writing the files), cli. This package never
imports TensorFlow (reports run on laptops and login nodes); matplotlib is imported only to draw the plots.
"""
