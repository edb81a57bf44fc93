"""bertology: see and measure what the attention heads of BERT-family transformers do.

The names below are imported on first use, so that ``bertology.cli`` (and ``bertology --help``) can
start without loading torch.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING

from bertology.errors import BertologyError, TruncationWarning
from bertology.lazy_exports import export_lazily


def _import_tqdm_without_its_notebook_warning() -> None:
    """In a notebook (IPython loaded), import ``tqdm.auto``, which transformers and the hub import, with its
    "IProgress not found" TqdmWarning left out: without ipywidgets it prints a red block at
    ``load_model()`` about bars bertology does not show. Only that warning, only during this import (the
    warning filters are restored after); outside IPython nothing is imported."""
    if "IPython" not in sys.modules or "tqdm.auto" in sys.modules:
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import tqdm.auto  # noqa: F401


_import_tqdm_without_its_notebook_warning()

if TYPE_CHECKING:
    from bertology.attention.capturing import (
        Attention,
        AttentionBatch,
        capture,
        capture_batch,
        capture_long_batch,
    )
    from bertology.attention.long_capture import LongAttention, LongAttentionBatch
    from bertology.models.loading import LoadedModel, load_model
    from bertology.models.sites import trace
    from bertology.views import View, head_view, model_view, neuron_view

_HOMES = {
    "Attention": "attention.capturing",
    "AttentionBatch": "attention.capturing",
    "capture": "attention.capturing",
    "capture_batch": "attention.capturing",
    "capture_long_batch": "attention.capturing",
    "LongAttention": "attention.long_capture",
    "LongAttentionBatch": "attention.long_capture",
    "LoadedModel": "models.loading",
    "load_model": "models.loading",
    "trace": "models.sites",
    "View": "views",
    "head_view": "views",
    "model_view": "views",
    "neuron_view": "views",
}

__all__ = [
    "Attention",
    "AttentionBatch",
    "BertologyError",
    "LoadedModel",
    "LongAttention",
    "LongAttentionBatch",
    "TruncationWarning",
    "View",
    "capture",
    "capture_batch",
    "capture_long_batch",
    "head_view",
    "load_model",
    "model_view",
    "neuron_view",
    "trace",
]

export_lazily(__name__, _HOMES)
