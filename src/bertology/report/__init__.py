"""Self-contained HTML reports assembling plots and tables (:mod:`~bertology.report.page` is the shell)."""

from bertology.report.analysis import save_analysis, write_analysis_report

__all__ = ["save_analysis", "write_analysis_report"]
