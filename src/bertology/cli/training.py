"""``bertology finetune`` and ``watch``: fine-tuning with the attention monitor, and its watch page."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated

import typer

from bertology.cli.app import app, err, out
from bertology.cli.options import DeviceOption, DtypeOption, ModelOption, positive_finite, require_task
from bertology.cli.progress import training_progress
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    MAX_SEED,
    MAX_THREADS,
)
from bertology.training.settings import FinetuneSettings

FINETUNE_DEFAULTS = FinetuneSettings()


@app.command()
def finetune(
    task_dir: Annotated[Path, typer.Argument(help="GLUE-style task folder with train.tsv and dev.tsv.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Run folder to write.")],
    model: ModelOption = FINETUNE_DEFAULTS.model,
    max_train: Annotated[
        int,
        typer.Option("--max-train", min=0, help="Train on a seeded random sample of this many (0: all)."),
    ] = FINETUNE_DEFAULTS.max_train or 0,
    max_dev: Annotated[
        int, typer.Option("--max-dev", min=0, help="Evaluate on the first N dev (0: all).")
    ] = 0,
    epochs: Annotated[
        int, typer.Option("--epochs", min=1, help="Passes over the sample.")
    ] = FINETUNE_DEFAULTS.epochs,
    max_len: Annotated[
        int, typer.Option("--max-len", min=1, help="Tokens per input, special tokens included.")
    ] = FINETUNE_DEFAULTS.max_length,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Examples per optimizer step.")
    ] = FINETUNE_DEFAULTS.batch_size,
    learning_rate: Annotated[
        float, typer.Option("--lr", callback=positive_finite, help="Peak learning rate (above 0).")
    ] = FINETUNE_DEFAULTS.learning_rate,
    eval_every: Annotated[
        int,
        typer.Option(
            "--eval-every",
            min=0,
            help="Also evaluate every N steps (0: at each epoch's end only).",
        ),
    ] = FINETUNE_DEFAULTS.eval_every or 0,
    watch_every: Annotated[
        int,
        typer.Option(
            "--watch-every",
            min=0,
            help="Record the probe set's attention every S steps (0: never).",
        ),
    ] = FINETUNE_DEFAULTS.watch_every,
    probe_set: Annotated[
        int,
        typer.Option("--probe-set", min=1, help="Dev examples whose attention is recorded."),
    ] = FINETUNE_DEFAULTS.probe_set,
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seeds the sample, new head, batches, dropout.")
    ] = 0,
    threads: Annotated[
        int,
        typer.Option(
            "--threads",
            min=0,
            max=MAX_THREADS,
            help="Torch threads (0: one per core; 1 is faster on a busy machine).",
        ),
    ] = 0,
    rules: Annotated[
        str,
        typer.Option(
            "--rules",
            help="Training rules to evaluate: default (ours), smdebug (SageMaker Debugger's), none, or "
            "NAME,NAME,... (see README, Training rules).",
        ),
    ] = FINETUNE_DEFAULTS.rules,
    rule_param: Annotated[
        list[str] | None,
        typer.Option(
            "--rule-param",
            help="Set a rule's parameter, NAME.PARAM=VALUE (repeatable): LossNotDecreasing.num_steps=20.",
        ),
    ] = None,
    stop_on: Annotated[
        str, typer.Option("--stop-on", help="Stop the run when one of these rules fires: NAME,NAME,...")
    ] = "",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run in the folder.")] = False,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Fine-tune a classifier on a GLUE-style task, recording how its attention changes (see 'watch')."""
    require_task("TASK_DIR", task_dir)
    from bertology.files.outputs import check_output_folder
    from bertology.training.loop import finetune as run_finetune

    check_output_folder(output)
    settings = FinetuneSettings(
        model=model,
        max_train=max_train or None,
        max_dev=max_dev or None,
        epochs=epochs,
        max_length=max_len,
        batch_size=batch_size,
        learning_rate=learning_rate,
        eval_every=eval_every or None,
        watch_every=watch_every,
        probe_set=probe_set,
        seed=seed,
        threads=threads or None,
        device=device,
        dtype=dtype,
        rules=rules,
        stop_on=tuple(name.strip() for name in stop_on.split(",") if name.strip()),
        rule_params=tuple(rule_param or ()),
    )
    settings.check()  # before the progress bar: a bad rule name is one sentence
    with training_progress(total=0) as on_progress:
        result = run_finetune(
            task_dir,
            output,
            settings,
            overwrite=overwrite,
            on_progress=on_progress,
            on_alert=lambda alert: err.print(f"Alert at {alert}", highlight=False, markup=False),
        )
    stopped = (
        "" if result.stopped_by is None else f"Stopped by {result.stopped_by.rule} at step {result.steps}. "
    )
    alerts = f", {len(result.alerts)} alerts in run.json" if result.alerts else ""
    out.print(
        f"{stopped}Fine-tuned {result.train_examples} examples for {result.steps} steps in "
        f"{result.seconds:.0f} s: dev accuracy {result.dev_accuracy:.4f} on {result.dev_examples} examples. "
        f"Wrote {output} (model/, run.json{alerts}, metrics.csv{', monitor.zarr' if watch_every else ''}).",
        highlight=False,
    )


@app.command()
def watch(
    run_dir: Annotated[
        Path, typer.Argument(help="Run folder from 'bertology finetune' or a monitor archive.")
    ],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="HTML file to write (default: RUN_DIR/watch.html).")
    ] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
) -> None:
    """Write a page showing the probe examples' attention at every recorded step and what changed."""
    from bertology.corpus.readers import file_problem
    from bertology.errors import BertologyError

    if not run_dir.is_dir():  # before the archive's reader (torch, zarr) is imported
        what = file_problem(run_dir) or "is a file"
        raise BertologyError(
            f"{run_dir} {what}; give a run folder of 'bertology finetune' or its monitor.zarr archive."
        )
    from bertology.files.outputs import check_output_file
    from bertology.training.watch import write_watch

    target = write_watch(run_dir, check_output_file(output or run_dir / "watch.html"))
    size_mb = target.stat().st_size / 1e6
    out.print(f"Wrote {target} ({size_mb:.2f} MB).", highlight=False)
    if open_:
        webbrowser.open(target.resolve().as_uri())
