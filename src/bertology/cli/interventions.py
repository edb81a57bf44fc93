"""``bertology ablate`` and ``explain``: head ablation, importance and pruning; saliency."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertology.cli.app import app, out
from bertology.cli.options import (
    DeviceOption,
    DtypeOption,
    RayOption,
    TextArgument,
    TextBArgument,
    ThreadsPerWorkerOption,
    WorkersOption,
    cluster_options,
    require_inputs,
    share_below_one,
)
from bertology.cli.progress import progress_bar
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    MAX_COUNT,
    MAX_IG_STEPS,
)

ClassifierArgument = Annotated[
    str,
    typer.Argument(help="A fine-tuned classifier: a run folder from 'bertology finetune' or a model folder."),
]


@app.command()
def ablate(
    model: ClassifierArgument,
    task_dir: Annotated[Path, typer.Option("--task", help="GLUE-style task folder; its dev set is scored.")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Folder for report.html, CSV, JSON and plots.")
    ],
    max_dev: Annotated[
        int, typer.Option("--max-dev", min=0, max=MAX_COUNT, help="Score the first N dev examples (0: all).")
    ] = 0,
    prune: Annotated[
        float,
        typer.Option(
            "--prune",
            min=0.0,
            max=1.0,
            callback=share_below_one,
            help="Share of heads to remove structurally, least important first (0: none; below 1).",
        ),
    ] = 0.5,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Examples per forward pass.")] = 32,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
) -> None:
    """Remove heads: each one alone, by importance and by ablation rank, and for real (a smaller model).
    With --ray the single-head sweep (split by heads) and the importance (by examples) run on the cluster."""
    cluster = cluster_options(ray, workers, threads_per_worker, False)  # a usage error before torch loads
    require_inputs({"--task": task_dir})
    from dataclasses import replace

    from bertology.cluster.ablation import AblationJob, ablate_on_pool
    from bertology.cluster.workers import cluster_pool
    from bertology.interventions.run import run_ablation
    from bertology.models import ModelSpec, load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.report.interventions import write_ablation_report

    check_output_folder(output)
    loaded = load_model(model, classifier=True, device=device, dtype=dtype)
    with output_folder(output) as folder:
        pruned_dir = folder / "pruned" if prune else None
        with progress_bar("", None) as on_progress:  # a bar per stage of the study
            study = {"prune_fraction": prune, "pruned_dir": pruned_dir, "on_progress": on_progress}
            if cluster is None:
                run = run_ablation(loaded, task_dir, max_dev=max_dev or None, batch_size=batch_size, **study)
            else:
                # workers start elsewhere: folders by their absolute paths
                classifier = str(Path(model).resolve()) if Path(model).exists() else model
                task = str(task_dir.resolve())
                spec = ModelSpec(classifier, device, dtype, classifier=True)
                with cluster_pool(AblationJob(spec, task, max_dev or None, batch_size), cluster) as pool:
                    run = ablate_on_pool(pool, loaded, **study)
        run = replace(run, pruned_dir=None if run.pruned_dir is None else output / run.pruned_dir.name)
        report = output / write_ablation_report(run, folder).name
    pruning = run.pruning
    pruned = (
        f" Pruned {pruning.removed} heads: accuracy {pruning.accuracy:.4f}, {pruning.speedup:.2f}x as fast; "
        f"saved in {run.pruned_dir}."
        if pruning is not None
        else ""
    )
    out.print(
        f"Dev accuracy {run.ablation.baseline:.4f} on {run.examples} examples ({run.seconds:.0f} s).{pruned} "
        f"Wrote {report} and the CSV, JSON and plots beside it.",
        highlight=False,
    )


@app.command()
def explain(
    model: ClassifierArgument,
    text: TextArgument,
    text_b: TextBArgument = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="HTML file to write; the JSON goes beside it.")
    ] = Path("explanation.html"),
    steps: Annotated[
        int,
        typer.Option("--steps", min=1, max=MAX_IG_STEPS, help="Integration points of integrated gradients."),
    ] = 50,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Which tokens the prediction rests on: gradient, gradient x input and integrated gradients."""
    from bertology.interventions.saliency import JSON_MARKS
    from bertology.interventions.saliency import explain as explain_prediction
    from bertology.models import load_model
    from bertology.outputs import check_output_file
    from bertology.report.interventions import write_explanation

    check_output_file(output, beside=(".json",), marks=JSON_MARKS)
    loaded = load_model(model, classifier=True, device=device, dtype=dtype)
    explanation = explain_prediction(loaded, text, text_b, steps=steps)
    page_path, json_path = write_explanation(explanation, output)
    out.print(
        f"Predicted {explanation.label!r} (probability {explanation.probability:.3f}); integrated gradients "
        f"miss f(x) - f(baseline) by {explanation.completeness_gap:.2g} (more --steps, less). "
        f"Wrote {page_path} and {json_path}.",
        highlight=False,
    )
