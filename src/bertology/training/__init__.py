"""Fine-tuning with an attention monitor, its run archive, and the page that shows attention change.

Its loop, monitor and archive sit with the computations (they may import the interventions, the models
and what lies below); its watch page and plots are renderers (``pyproject.toml`` places each module).

:func:`finetune` trains a classifier on a GLUE-style task into a run folder. :class:`AttentionMonitor`
records a probe set's attention during any training loop (for Hugging Face's Trainer:
:class:`~bertology.training.callback.MonitorCallback`); :func:`read_archive` reads the records;
:func:`bertology.training.watch.watch_html` renders a run as one page.

The names are imported on first use (so ``bertology.training.settings`` loads without torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertology.lazy_exports import export_lazily

if TYPE_CHECKING:
    from bertology.training.archive import MonitorArchive, read_archive
    from bertology.training.loop import FinetuneResult, finetune
    from bertology.training.monitor import AttentionMonitor, ProbeSet
    from bertology.training.settings import FinetuneSettings, TrainingProgress

_HOMES = {
    "AttentionMonitor": "monitor",
    "FinetuneResult": "loop",
    "FinetuneSettings": "settings",
    "MonitorArchive": "archive",
    "ProbeSet": "monitor",
    "TrainingProgress": "settings",
    "finetune": "loop",
    "read_archive": "archive",
}
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

export_lazily(__name__, _HOMES)
