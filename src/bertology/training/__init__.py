"""Fine-tuning with an attention monitor, its run archive, and the page that shows attention change.

:func:`finetune` trains a classifier on a GLUE-style task into a run folder. :class:`AttentionMonitor`
records a probe set's attention during any training loop (for Hugging Face's Trainer:
:class:`~bertology.training.callback.MonitorCallback`); :func:`read_archive` reads the records;
:func:`bertology.training.watch.watch_html` renders a run as one page.
"""

from bertology.training.archive import MonitorArchive, read_archive
from bertology.training.finetune import FinetuneResult, FinetuneSettings, TrainingProgress, finetune
from bertology.training.monitor import AttentionMonitor, ProbeSet

__all__ = [
    "AttentionMonitor",
    "FinetuneResult",
    "FinetuneSettings",
    "MonitorArchive",
    "ProbeSet",
    "TrainingProgress",
    "finetune",
    "read_archive",
]
