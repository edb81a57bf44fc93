"""Self-contained HTML reports assembling plots and tables (:mod:`~bertology.report.page` is the shell).

A renderer: it may import the computations and their results (analysis, probes, interventions, training)
and everything below them, never the server or the command line.
"""

from bertology.report.analysis import save_analysis, write_analysis_report

__all__ = ["save_analysis", "write_analysis_report"]
