"""``bertology ablate``, ``explain`` and ``attack``: head ablation, importance and pruning; saliency;
explanations by changing the input."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bertology.cli.app import app, err, out
from bertology.cli.options import (
    DeviceOption,
    DtypeOption,
    InterpretConventionOption,
    RayOption,
    TextArgument,
    TextBArgument,
    ThreadsPerWorkerOption,
    WorkersOption,
    cluster_options,
    number_in,
    require_inputs,
    require_task,
    share_below_one,
)
from bertology.cli.progress import progress_bar
from bertology.files.run_files import ATTACK_FILE, EXPLANATION_FILE
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    MAX_IG_STEPS,
    MAX_SEED,
    MAX_SMOOTHGRAD_SAMPLES,
    SALIENCY_METHODS,
    SMOOTHGRAD_NOISE,
    AblationKind,
    AttackMethod,
    Dtype,
)

if TYPE_CHECKING:
    from bertology.cluster.workers import ClusterOptions

#: ``ablate --prune``'s default: the share of heads removed structurally.
DEFAULT_PRUNE = 0.5
#: ``ablate --attribution-examples``'s default (``--task``).
DEFAULT_ATTRIBUTION_EXAMPLES = 200
#: ``ablate --max-len``'s default (``--lm-corpus``).
DEFAULT_LM_LENGTH = 128

ClassifierArgument = Annotated[
    str,
    typer.Argument(help="A fine-tuned classifier: a run folder from 'bertology finetune' or a model folder."),
]


@app.command()
def ablate(
    model: Annotated[
        str,
        typer.Argument(
            help="A fine-tuned classifier (a run folder from 'bertology finetune' or a model folder) with "
            "--task, or a decoder or encoder-decoder language model (a name or folder) with --lm-corpus."
        ),
    ],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Folder for report.html, CSV, JSON and plots.")
    ],
    max_dev: Annotated[
        int, typer.Option("--max-dev", min=0, help="Score the first N dev examples (0: all).")
    ] = 0,
    task_dir: Annotated[
        Path | None, typer.Option("--task", help="GLUE-style task folder; its dev set is scored.")
    ] = None,
    lm_corpus: Annotated[
        Path | None,
        typer.Option(
            "--lm-corpus",
            help="Corpus file (text, JSONL or CoNLL-U) scored by a decoder's next-token loss, or JSONL with "
            "'text' and 'target' scored by an encoder-decoder's loss of each target (not --task).",
        ),
    ] = None,
    max_segments: Annotated[
        int,
        typer.Option("--max-segments", min=0, help="--lm-corpus: its first N segments (0: all)."),
    ] = 0,
    max_len: Annotated[
        int,
        typer.Option("--max-len", min=2, help="--lm-corpus: tokens per segment, special tokens included."),
    ] = DEFAULT_LM_LENGTH,
    prune: Annotated[
        float | None,
        typer.Option(
            "--prune",
            callback=lambda value: None if value is None else share_below_one(value),
            help="Share of heads to remove structurally, least important first (0: none; below 1; default "
            f"{DEFAULT_PRUNE}, for an encoder-decoder 0: it has no structural pruning).",
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Examples per forward pass.")] = 32,
    attribution_examples: Annotated[
        int,
        typer.Option(
            "--attribution-examples",
            min=0,
            help="Score heads by self-attention attribution on the first N dev examples (0: skip).",
        ),
    ] = DEFAULT_ATTRIBUTION_EXAMPLES,
    ablation: Annotated[
        AblationKind,
        typer.Option(
            "--ablation",
            help="What a removed head's output becomes in the sweep and pruning curves: zero, its mean over "
            "the dev or corpus inputs, or its output on another of them (resample).",
        ),
    ] = "zero",
    seed: Annotated[
        int,
        typer.Option("--seed", min=0, max=MAX_SEED, help="--ablation resample: seed of the other inputs."),
    ] = 0,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
) -> None:
    """Remove heads: each one alone, by importance, ablation rank, attribution and at random, and for real.
    Scored by a classifier's dev accuracy (--task) or a language-model loss (--lm-corpus: a decoder's
    next-token loss, or an encoder-decoder's loss of each target, its heads in three stacks: encoder,
    decoder, cross). With --ray the single-head sweep (split by heads) and the importance (by examples) run
    on the cluster."""
    cluster = cluster_options(ray, workers, threads_per_worker, False)  # a usage error before torch loads
    if (task_dir is None) == (lm_corpus is None):
        raise typer.BadParameter(
            "give either --task (a classifier) or --lm-corpus (a decoder or an encoder-decoder)."
        )
    given = {  # options of one of the two, given with another value than the default
        "--max-dev": (max_dev != 0, "--task"),
        "--attribution-examples": (attribution_examples != DEFAULT_ATTRIBUTION_EXAMPLES, "--task"),
        "--max-segments": (max_segments != 0, "--lm-corpus"),
        "--max-len": (max_len != DEFAULT_LM_LENGTH, "--lm-corpus"),
    }
    for option, (changed, belongs) in given.items():
        if changed and (belongs == "--task") != (task_dir is not None):
            raise typer.BadParameter(f"{option} goes with {belongs}, which was not given.")
    if cluster is not None and ablation != "zero":
        raise typer.BadParameter("--ablation mean and resample run here only; leave out --ray.")
    if lm_corpus is not None:
        if cluster is not None:
            raise typer.BadParameter("--lm-corpus runs here only; leave out --ray.")
        require_inputs({"--lm-corpus": lm_corpus})
        from bertology.models.loading import model_kind

        default_prune = 0.0 if model_kind(model) == "encoder-decoder" else DEFAULT_PRUNE
        inputs: dict[str, Any] = {
            "corpus": lm_corpus,
            "max_segments": max_segments or None,
            "max_length": max_len,
        }
    else:
        assert task_dir is not None
        require_inputs({"--task": task_dir})
        default_prune = DEFAULT_PRUNE
        inputs = {
            "task_dir": task_dir,
            "max_dev": max_dev or None,
            "attribution_examples": attribution_examples,
            "cluster": cluster,
        }
    _ablate(
        model,
        output,
        device,
        dtype,
        batch_size,
        prune_fraction=default_prune if prune is None else prune,
        ablation=ablation,
        resample_seed=seed,
        **inputs,
    )


def _ablate(
    model: str,
    output: Path,
    device: str,
    dtype: Dtype,
    batch_size: int,
    *,
    prune_fraction: float,
    ablation: AblationKind,
    resample_seed: int,
    task_dir: Path | None = None,
    max_dev: int | None = None,
    attribution_examples: int = 0,
    cluster: ClusterOptions | None = None,
    corpus: Path | None = None,
    max_segments: int | None = None,
    max_length: int = DEFAULT_LM_LENGTH,
) -> None:
    """``ablate``'s study (:func:`~bertology.interventions.run.run_ablation`) of a classifier on the dev set
    of ``task_dir`` (its sweep and importance on ``cluster``'s workers where given), or of a language model on
    ``corpus``; writes the folder and tells what it found."""
    from dataclasses import replace

    from bertology.cluster.ablation import AblationJob, ablate_on_pool
    from bertology.cluster.workers import cluster_pool
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.interventions.run import classifier_task, corpus_task, run_ablation
    from bertology.models.loading import ModelSpec, load_model
    from bertology.report.interventions import write_ablation_report

    check_output_folder(output)
    if task_dir is not None:
        require_task("--task", task_dir)  # its files, after the output and before the model
    scored_by = {"language_model": True} if corpus is not None else {"classifier": True}
    loaded = load_model(model, device=device, dtype=dtype, **scored_by)
    with output_folder(output) as folder:
        pruned_dir = folder / "pruned" if prune_fraction else None
        with progress_bar("", None) as on_progress:  # a bar per stage of the study
            study = {
                "prune_fraction": prune_fraction,
                "pruned_dir": pruned_dir,
                "on_progress": on_progress,
                "attribution_examples": attribution_examples,
            }
            if cluster is not None and task_dir is not None:
                # workers start elsewhere: folders by their absolute paths
                classifier = str(Path(model).resolve()) if Path(model).exists() else model
                spec = ModelSpec(classifier, device, dtype, classifier=True)
                job = AblationJob(spec, str(task_dir.resolve()), max_dev, batch_size)
                with cluster_pool(job, cluster) as pool:
                    run = ablate_on_pool(pool, loaded, **study)
            else:
                if task_dir is not None:
                    task, source = classifier_task(loaded, task_dir, max_dev)
                else:
                    assert corpus is not None
                    task = corpus_task(loaded, corpus, max_length=max_length, max_segments=max_segments)
                    source = corpus.name
                run = run_ablation(
                    task,
                    source,
                    batch_size=batch_size,
                    ablation=ablation,
                    resample_seed=resample_seed,
                    **study,
                )
        run = replace(run, pruned_dir=None if run.pruned_dir is None else output / run.pruned_dir.name)
        report = output / write_ablation_report(run, folder).name
    if run.warning is not None:
        err.print(f"[yellow]Warning:[/yellow] {run.warning}", highlight=False)
    pruning = run.pruning
    pruned = ""
    if pruning is not None:
        key_values = pruning.total_key_value_heads - pruning.key_value_heads
        with_them = f" ({key_values} key/value heads with them)" if pruning.grouped else ""
        pruned = (
            f" Pruned {pruning.removed} heads{with_them}: {pruning.score.name} {pruning.value:.4f}, "
            f"{pruning.speedup:.2f}x as fast; saved in {run.pruned_dir}."
        )
    out.print(
        f"{run.words('headline')} ({run.seconds:.0f} s).{pruned} Wrote {report} and the CSV, JSON and plots "
        "beside it.",
        highlight=False,
    )


def saliency_methods(values: list[str] | None) -> list[str] | None:
    """``--method`` as given (each value may list several, separated by commas), or a usage error for a
    method of no known name."""
    if values is None:
        return None
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in SALIENCY_METHODS]
    if unknown or not names:
        raise typer.BadParameter(f"'{', '.join(unknown)}' is not one of {', '.join(SALIENCY_METHODS)}.")
    return list(dict.fromkeys(names))


@app.command()
def explain(
    model: Annotated[
        str,
        typer.Argument(
            help="A fine-tuned classifier (a run folder from 'bertology finetune' or a model folder), or a "
            "decoder language model (a name or folder) whose next token after TEXT is explained."
        ),
    ],
    text: TextArgument,
    text_b: TextBArgument = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="What to explain instead of the prediction: a classifier's label name, or a decoder's next "
            "token (one token; mind its leading space, e.g. ' Paris').",
        ),
    ] = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="HTML file to write; the JSON goes beside it.")
    ] = Path(EXPLANATION_FILE),
    method: Annotated[
        list[str] | None,
        typer.Option(
            "--method",
            metavar="|".join(SALIENCY_METHODS),
            callback=saliency_methods,
            help="Attribution method; repeat it or separate several by commas (default: all).",
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            min=1,
            max=MAX_IG_STEPS,
            help="Integration points of integrated gradients (default: the convention's, 50 or 10).",
        ),
    ] = None,
    noise: Annotated[
        float,
        typer.Option(
            "--noise",
            callback=number_in(0, 10),
            help="SmoothGrad's noise level: the noise's standard deviation over the range of the input's "
            "embedding components (0 to 10).",
        ),
    ] = SMOOTHGRAD_NOISE,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            min=1,
            max=MAX_SMOOTHGRAD_SAMPLES,
            help="Noisy copies SmoothGrad averages (default: the convention's, 50 or 10).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed of SmoothGrad's noise.")] = 0,
    convention: InterpretConventionOption = "bertology",
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Which tokens the prediction rests on: gradient, input x gradient, integrated gradients, SmoothGrad;
    for a decoder's next token also each head's direct contribution to its logit. --convention allennlp:
    AllenNLP Interpret's definitions (a classifier)."""
    from bertology.files.outputs import check_output_file
    from bertology.interventions.saliency import JSON_MARKS, explanation_settings
    from bertology.interventions.saliency import explain as explain_prediction
    from bertology.models.loading import load_model, model_kind
    from bertology.report.interventions import write_explanation

    check_output_file(output, beside=(".json",), marks=JSON_MARKS)
    decoder = model_kind(model) == "decoder"
    explanation_settings(method, steps, noise, samples, convention, decoder=decoder)
    head = {"language_model": True} if decoder else {"classifier": True}
    loaded = load_model(model, device=device, dtype=dtype, **head)
    explanation = explain_prediction(
        loaded,
        text,
        text_b,
        target=target,
        methods=method,
        steps=steps,
        noise=noise,
        samples=samples,
        seed=seed,
        convention=convention,
    )
    page_path, json_path = write_explanation(explanation, output)
    gap = explanation.completeness_gap
    completeness = (
        ""
        if gap is None
        else f"integrated gradients miss f(x) - f(baseline) by {gap:.2g} (more --steps, less). "
    )
    explained = (
        f"Predicted {explanation.label!r}"
        if explanation.label == explanation.predicted
        else f"Explained {explanation.label!r} (predicted {explanation.predicted!r})"
    )
    out.print(
        f"{explained} (probability {explanation.probability:.3f}; {convention} convention); {completeness}"
        f"Wrote {page_path} and {json_path}.",
        highlight=False,
    )


@app.command()
def attack(
    model: ClassifierArgument,
    text: TextArgument,
    text_b: TextBArgument = None,
    method: Annotated[
        AttackMethod,
        typer.Option(
            "--method",
            help="input-reduction (remove the least important tokens while the prediction holds, Feng et al. "
            "2018) or hotflip (the token swaps that change it, Ebrahimi et al. 2018).",
        ),
    ] = "input-reduction",
    output: Annotated[
        Path, typer.Option("-o", "--output", help="HTML file to write; the JSON goes beside it.")
    ] = Path(ATTACK_FILE),
    beam: Annotated[int, typer.Option("--beam", min=1, max=100, help="Input reduction's beam width.")] = 3,
    max_flips: Annotated[
        int,
        typer.Option("--max-flips", min=0, help="Most swaps HotFlip makes (0: no limit)."),
    ] = 0,
    subwords: Annotated[
        bool,
        typer.Option(
            "--subwords", help="Let HotFlip swap in any non-special vocabulary entry, not only whole words."
        ),
    ] = False,
    convention: InterpretConventionOption = "bertology",
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Explain a prediction by changing the input: the reduced input, or the swaps that flip it.
    --convention allennlp: AllenNLP Interpret's definitions."""
    from bertology.files.outputs import check_output_file
    from bertology.interventions.attacks import JSON_MARKS, check_attack_settings
    from bertology.interventions.attacks import attack as attack_input
    from bertology.models.loading import load_model
    from bertology.report.attacks import write_attack

    check_output_file(output, beside=(".json",), marks=JSON_MARKS)
    check_attack_settings(method, beam, max_flips or None, subwords, convention)
    loaded = load_model(model, classifier=True, device=device, dtype=dtype)
    result = attack_input(
        loaded,
        text,
        text_b,
        method=method,
        beam=beam,
        max_flips=max_flips or None,
        subwords=subwords,
        convention=convention,
    )
    page_path, json_path = write_attack(result, output)
    last = result.result
    outcome = (
        "nothing changed"
        if last is None
        else f"{len(result.steps)} step{'s' if len(result.steps) != 1 else ''}, then {last.label!r} "
        f"(probability {last.probability:.3f}): {last.text!r}"
        + ("" if last.text_b is None else f" / {last.text_b!r}")
    )
    out.print(
        f"Predicted {result.label!r} (probability {result.probability:.3f}); {method} ({convention} "
        f"convention): {outcome}. "
        f"Wrote {page_path} and {json_path}.",
        highlight=False,
    )
