"""A fine-tuning run's folder: what it holds, the check before a run is written there, the staging of a
run over an earlier one, and the status of a run read back.

A run folder holds:

- ``model/``: the fine-tuned model and tokenizer (``save_pretrained``); ``load_model(RUN_DIR,
  classifier=True)`` loads it.
- ``run.json``: task, model, settings, labels, sizes, status (``running``, ``finished``, ``stopped``
  when a rule of ``stop_on`` fired, with the alert as ``stopped_by``, or ``interrupted`` when training
  stopped on an error or Ctrl-C, with the ``error``), the ``pid`` and ``host`` of the training process
  (:func:`run_status` tells a run whose process is gone), steps, time, the final dev accuracy and loss,
  and the training rules' ``alerts`` (rewritten as they fire; :mod:`bertology.training.rules`).
- ``metrics.jsonl`` (a line per log and evaluation, appended as training goes) and ``metrics.csv``:
  ``split`` = ``train`` rows (mean loss over the last ``log_every`` steps, learning rate) and ``dev``
  rows (accuracy and mean cross-entropy over the dev examples; the accuracy is NaN when a logit is not
  finite, since the arg-max of NaN logits is no prediction).
- ``monitor.zarr``: the attention monitor's archive (:mod:`bertology.training.archive`), with the training
  loss of every step (``losses``).
- ``signals.jsonl``: the per-layer gradient norms, weight-update norms and activation saturation of every
  ``watch_every``-th step (:mod:`bertology.training.signals`), when rules are evaluated.
- ``tensors.jsonl``: what SageMaker Debugger's rules (``rules="smdebug"``) read of every watched step
  (per-layer gradient and weight statistics, activation activity, token counts), when one of them is
  selected (:mod:`bertology.training.tensor_recorder`); they, and our ``one_class_predictions``, also
  read each dev evaluation's confusion matrix.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bertology.errors import BertologyError
from bertology.files.run_files import TRAINING_FILE
from bertology.models.loading import RUN_MODEL_FOLDER
from bertology.training.archive import ARCHIVE_FOLDER

METRICS_JSONL = "metrics.jsonl"
METRICS_CSV = "metrics.csv"
SIGNALS_JSONL = "signals.jsonl"
TENSORS_JSONL = "tensors.jsonl"

#: What a run writes in its folder; nothing else there is touched.
RUN_OUTPUTS = (
    TRAINING_FILE, METRICS_JSONL, METRICS_CSV, RUN_MODEL_FOLDER, ARCHIVE_FOLDER, SIGNALS_JSONL, TENSORS_JSONL,
)  # fmt: skip


def check_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Raise unless a run can be written into ``run_dir``, without changing anything.

    The folder may hold other files. An earlier run there (``run.json``) is replaced only with
    ``overwrite``; a run output's name (``model``, ``metrics.csv``, ...) without ``run.json`` is not a run
    of ours, so it is never replaced.

    Raises:
        BertologyError: ``run_dir`` is a file or not writable, holds a run (without ``overwrite``), or holds
            files with the names of a run's outputs but no ``run.json``.
    """
    from bertology.files.outputs import check_output_folder

    check_output_folder(run_dir)
    if (run_dir / TRAINING_FILE).exists():
        if not overwrite:
            raise BertologyError(
                f"{run_dir} already holds a training run; choose a new folder, or replace it with "
                "--overwrite (overwrite=True in Python)."
            )
        return
    foreign = [name for name in RUN_OUTPUTS if (run_dir / name).exists() or (run_dir / name).is_symlink()]
    if foreign:
        raise BertologyError(
            f"{run_dir} holds {', '.join(foreign)} but no {TRAINING_FILE}, so not a run of bertology's; "
            "choose a new folder (nothing there is replaced)."
        )


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON through a temporary file and a rename, so readers never see half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(partial, path)


@contextmanager
def run_folder(run_dir: Path) -> Iterator[Path]:
    """The folder a run (checked by :func:`check_run_dir`) writes in: ``run_dir`` itself for a new run, so
    that it can be watched as it trains; over an earlier run, a staging folder beside it
    (:func:`bertology.files.outputs.output_folder`) that replaces the earlier run (:data:`RUN_OUTPUTS`,
    each whole; the folder's other files kept) in one step only when the block ends without an error, so
    a run killed or stopped on the way leaves the earlier run as it was. Either way, a run that ends
    without an error then removes the staging folders that killed runs left beside ``run_dir``."""
    from bertology.files.outputs import output_folder
    from bertology.files.swap import remove_stale_staging

    if not (run_dir / TRAINING_FILE).exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        yield run_dir
        remove_stale_staging(run_dir.resolve())
        return
    with output_folder(run_dir, replace=RUN_OUTPUTS) as staging:
        yield staging


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def run_status(run: dict[str, Any]) -> str:
    """The status of the run that ``run`` (its ``run.json``) describes: its recorded ``status``, except
    that a run recorded as ``"running"`` by a process of this machine that no longer exists (killed, or
    the machine restarted) is ``"interrupted"``."""
    status = str(run.get("status", ""))
    pid = run.get("pid")
    if status == "running" and isinstance(pid, int) and run.get("host") == socket.gethostname():
        return status if _process_alive(pid) else "interrupted"
    return status


@contextmanager
def marked_if_stopped(path: Path, run_info: dict[str, Any]) -> Iterator[None]:
    """Should the block stop on an error or Ctrl-C, rewrite ``run.json`` at ``path`` as ``"interrupted"``
    with the error, and let the error go on."""
    try:
        yield
    except BaseException as error:
        stopped = {"status": "interrupted", "error": f"{type(error).__name__}: {error}".rstrip(": ")}
        write_json(path, run_info | stopped)
        raise
