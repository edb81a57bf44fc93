"""Where bertology keeps what it builds once and reuses: the packaged models assembled from their parts
and the encoded corpora."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder: ``$BERTOLOGY_CACHE`` or ``~/.cache/bertology``."""
    return Path(os.environ.get("BERTOLOGY_CACHE") or Path.home() / ".cache" / "bertology")
