"""``bertology probe deps | parser | coref | gap``: the linguistic probes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertology.cli.app import BertologyApp, app, out, resumable
from bertology.cli.options import (
    DeviceOption,
    DtypeOption,
    ModelOption,
    RayOption,
    ResumeOption,
    ThreadsPerWorkerOption,
    WorkersOption,
    cluster_options,
    require_inputs,
)
from bertology.cli.progress import progress_bar
from bertology.corpus.readers.coref import CorefFormat
from bertology.corpus.readers.treebank import TreebankFormat
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    Decode,
    WordMode,
)

probe_app = BertologyApp(
    help="Linguistic probes: heads that track dependency relations (deps), the attention-only parser "
    "(parser), coreference (coref) and GAP's pronoun resolution (gap).",
    no_args_is_help=True,
)
app.add_typer(probe_app, name="probe")

TreebankFormatOption = Annotated[
    TreebankFormat | None,
    typer.Option("--format", help="conllu, conllx or corefud (default: from the file name)."),
]
WordModeOption = Annotated[
    WordMode, typer.Option("--word-mode", help="How a split word attends: mean, first or max of its pieces.")
]


@probe_app.command("deps")
def probe_deps(
    treebank: Annotated[Path, typer.Argument(help="CoNLL-U or CoNLL-X file, or a folder of them.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html and CSV.")],
    model: ModelOption = "default",
    treebank_format: TreebankFormatOption = None,
    word_mode: WordModeOption = "mean",
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="Probe at most this many sentences."),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=4096, help="Sentences per forward pass.")
    ] = 16,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
    resume: ResumeOption = False,
) -> None:
    """Which heads track which dependency relations, against fixed-offset baselines (Clark et al. 2019)."""
    cluster = cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    require_inputs({"TREEBANK": treebank})
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.cluster.driver import ShardedRun
    from bertology.cluster.probes import DependencyJob, probe_dependencies_on_pool
    from bertology.cluster.workers import cluster_pool
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.loading import ModelSpec, load_model
    from bertology.probes.run import probe_dependencies
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    checkpoint = checkpoint_file(output, "probe-deps")
    with progress_bar("Probing sentences", limit, rate="sentences") as on_progress:
        reading = {"treebank_format": treebank_format, "limit": limit, "batch_size": batch_size}
        if cluster is None:
            run = probe_dependencies(treebank, loaded, mode=word_mode, on_progress=on_progress, **reading)
        else:
            job = DependencyJob(ModelSpec(model, device, dtype), word_mode)
            sharded = ShardedRun(checkpoint, resume, on_progress=on_progress)
            with resumable(checkpoint), cluster_pool(job, cluster) as pool:
                run = probe_dependencies_on_pool(pool, treebank, loaded, **reading, sharded=sharded)
    with output_folder(output) as folder:
        report = output / write_probe_report(run, folder).name
    checkpoint.unlink(missing_ok=True)  # the run is written; nothing is left to resume
    out.print(
        f"Probed {run.sentences} sentences in {run.seconds:.1f} s. Wrote {report}, {output / run.table_file} "
        f"and {output / run.frame_file}.",
        highlight=False,
    )


@probe_app.command("parser")
def probe_parser_command(
    train: Annotated[Path, typer.Option("--train", help="Treebank to train on (file or folder).")],
    evaluation: Annotated[Path, typer.Option("--eval", help="Treebank to score UAS on (file or folder).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html and CSV.")],
    model: ModelOption = "default",
    treebank_format: TreebankFormatOption = None,
    word_mode: WordModeOption = "mean",
    limit_train: Annotated[
        int | None, typer.Option("--limit-train", min=1, help="Train on the first N.")
    ] = None,
    limit_eval: Annotated[int | None, typer.Option("--limit-eval", min=1, help="Score the first N.")] = None,
    decode: Annotated[
        Decode, typer.Option(help="argmax (per word) or mst (Chu-Liu/Edmonds tree).")
    ] = "argmax",
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Clark et al.'s attention-only parser: train on one treebank, UAS without punctuation on another."""
    require_inputs({"--train": train, "--eval": evaluation})
    from bertology.corpus.readers.treebank import check_treebank
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.loading import load_model
    from bertology.probes.run import probe_parser
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    check_treebank(evaluation, treebank_format, limit_eval)  # scored after the training: checked first
    loaded = load_model(model, device=device, dtype=dtype)
    with progress_bar("", None) as on_progress:  # a bar per treebank
        run = probe_parser(
            train,
            evaluation,
            loaded,
            treebank_format=treebank_format,
            mode=word_mode,
            limit_train=limit_train,
            limit_eval=limit_eval,
            decode=decode,
            on_progress=on_progress,
        )
    with output_folder(output) as folder:
        report = output / write_probe_report(run, folder).name
    scores = run.report
    out.print(
        f"UAS {scores.uas:.3f} (right-branching {scores.right_branching_uas:.3f}, best single head "
        f"{scores.single_head_uas:.3f}) in {run.seconds:.1f} s. "
        f"Wrote {report} and {output / run.table_file}.",
        highlight=False,
    )


@probe_app.command("coref")
def probe_coref(
    corpus: Annotated[
        Path, typer.Argument(help="Coreference file or folder (GUM brackets, CoNLL-2012 or CorefUD).")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html and table.csv.")],
    model: ModelOption = "default",
    treebank: Annotated[
        Path | None,
        typer.Option("--treebank", help="The same documents' trees, for sentences and head words."),
    ] = None,
    coref_format: Annotated[
        CorefFormat | None,
        typer.Option("--format", help="gum, conll2012 or corefud (default: corefud for .conllu files)."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="Probe at most this many documents."),
    ] = None,
    windows: Annotated[
        int,
        typer.Option("--batch-size", min=1, max=4096, help="Document windows per forward pass."),
    ] = 8,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
    resume: ResumeOption = False,
) -> None:
    """Antecedent selection per head, by mention type, against nearest, same-head and sieve baselines."""
    cluster = cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    require_inputs({"CORPUS": corpus, "--treebank": treebank})
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.cluster.driver import ShardedRun
    from bertology.cluster.probes import CorefJob, probe_coreference_on_pool
    from bertology.cluster.workers import cluster_pool
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.loading import ModelSpec, load_model
    from bertology.probes.run import probe_coreference
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    checkpoint = checkpoint_file(output, "probe-coref")
    reading = {"treebank": treebank, "coref_format": coref_format, "limit": limit, "batch_size": windows}
    with progress_bar("Probing coreference windows", None, rate="windows") as on_progress:
        if cluster is None:
            run = probe_coreference(corpus, loaded, **reading, on_progress=on_progress)
        else:
            with resumable(checkpoint):
                sharded = ShardedRun(checkpoint, resume, on_progress=on_progress)
                with cluster_pool(CorefJob(ModelSpec(model, device, dtype)), cluster) as pool:
                    run = probe_coreference_on_pool(pool, corpus, loaded, **reading, sharded=sharded)
    with output_folder(output) as folder:
        report = output / write_probe_report(run, folder).name
    checkpoint.unlink(missing_ok=True)  # the run is written; nothing is left to resume
    best = run.best()
    out.print(f"Best head {best.label}: {best.score:.3f}. Wrote {report}.", highlight=False)


@probe_app.command("gap")
def probe_gap_command(
    gap_file: Annotated[Path, typer.Argument(help="GAP tsv (development, validation or test).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html and CSV.")],
    model: ModelOption = "default",
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most this many examples.")] = None,
    syntax: Annotated[
        bool, typer.Option("--syntax/--no-syntax", help="Syntactic baselines from spaCy parses, if any.")
    ] = True,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """GAP's scorecard (P/R/F1 overall, masculine, feminine, bias F/M) for every head and GAP's baselines."""
    require_inputs({"GAP_FILE": gap_file})
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.loading import load_model
    from bertology.probes.run import probe_gap
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    with progress_bar("Scoring GAP examples", limit, rate="examples") as on_progress:
        run = probe_gap(gap_file, loaded, limit=limit, syntax=syntax, on_progress=on_progress)
    with output_folder(output) as folder:
        report = output / write_probe_report(run, folder).name
    best = run.table().iloc[0]
    out.print(
        f"Best head {best['system'].removeprefix('head ')}: F1 {best['overall_f1']:.3f} (masculine "
        f"{best['masculine_f1']:.3f}, feminine {best['feminine_f1']:.3f}, bias F/M {best['bias_f_m']:.2f}) "
        f"over {run.probe.examples} examples. Wrote {report} and {output / run.table_file}.",
        highlight=False,
    )
