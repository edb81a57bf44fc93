"""The ``bertology`` command: one subcommand per verb, each a thin call into the library.

Only light modules are imported here (choices and defaults from :mod:`bertology.options`); each command
imports what it runs, so ``bertology --help`` and usage errors answer without loading torch.
"""

from __future__ import annotations

import os
import sys
import warnings
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, TextIO

import typer
from rich.console import Console
from rich.table import Table

from bertology.options import (
    BATCH_SIZE,
    FLOW_MAX_TOKENS,
    JS_TOKENS_PER_SEGMENT,
    AttentionSetName,
    Convention,
    CorpusFormat,
    Decode,
    Level,
    Theme,
    ViewKind,
    Weights,
    WordMode,
)
from bertology.readers.coref import CorefFormat
from bertology.readers.treebank import TreebankFormat
from bertology.training.settings import FinetuneSettings, TrainingProgress

if TYPE_CHECKING:
    from bertology.interventions.ablation import AblationResult

app = typer.Typer(
    name="bertology",
    help="See and measure what the attention heads of BERT-family transformers do.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

ModelOption = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="'default' (all-MiniLM-L6-v2, offline), a hub name or a local directory."
    ),
]
SegmentBatchOption = Annotated[
    int, typer.Option("--batch-size", min=1, help="Segments per forward pass (sorted by length).")
]
WeightsOption = Annotated[
    Weights,
    typer.Option(
        "--weights",
        help="attention (softmax weights) or norm (norm-based weights ||a f(x)||, Kobayashi et al. 2020).",
    ),
]
ConventionOption = Annotated[
    Convention,
    typer.Option(
        "--convention",
        help="bertology (each statistic averaged over the queries it is defined for) or clark (the numbers "
        "of Clark et al.'s released analysis code).",
    ),
]


def _utf8_text(text: str | None) -> str | None:
    """A text argument as given, or a usage error when the command line's bytes are not UTF-8 (Python
    keeps such bytes as lone surrogates, which no tokenizer or file takes)."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise typer.BadParameter(f"'{shown}' is not valid UTF-8 text; give the text in UTF-8.") from None
    return text


TextArgument = Annotated[str, typer.Argument(help="The text (text A of a pair).", callback=_utf8_text)]
TextBArgument = Annotated[
    str | None,
    typer.Argument(help="Optional second text (text B of a pair).", callback=_utf8_text),
]


class _State:
    debug = False


@app.callback()
def _global(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
) -> None:
    _State.debug = debug


def _quiet_libraries() -> None:
    """Only errors from transformers and the hub, no download bars (set for this process before either is
    imported, unless the user set them), and warnings as one yellow line."""
    for name, value in (
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("HF_HUB_VERBOSITY", "error"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ):
        os.environ.setdefault(name, value)

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        err.print(f"[yellow]Warning:[/yellow] {message}", highlight=False)

    warnings.showwarning = show


@contextmanager
def _progress(what: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for long work; yields the callback that reports how many are done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(what, total=total)
        yield lambda done: progress.update(task, completed=done)


@app.command()
def view(
    text: TextArgument,
    text_b: TextBArgument = None,
    model: ModelOption = "default",
    kind: Annotated[ViewKind, typer.Option("--view", "-v", help="head, model or neuron.")] = "head",
    layer: Annotated[int, typer.Option("--layer", "-l", help="Layer shown first (0-based).")] = 0,
    head: Annotated[int, typer.Option("--head", help="Head shown first in the neuron view (0-based).")] = 0,
    theme: Annotated[Theme, typer.Option(help="light or dark.")] = "light",
    output: Annotated[Path | None, typer.Option("-o", "--output", help="HTML file to write.")] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
    weights: WeightsOption = "attention",
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="Encoder-decoder models: the target text (TEXT is the source).",
            callback=_utf8_text,
        ),
    ] = None,
    attention: Annotated[
        AttentionSetName,
        typer.Option("--attention", help="Encoder-decoder models: encoder, decoder or cross, shown first."),
    ] = "cross",
) -> None:
    """Write a head, model or neuron view of TEXT (or the pair TEXT TEXT_B, or for an encoder-decoder model
    the source TEXT and --target) as one self-contained page."""
    from bertology.models import load_model
    from bertology.outputs import check_output_file
    from bertology.views import render_view

    target_file = check_output_file(output or Path(f"{kind}_view.html"))
    loaded = load_model(model)
    page = render_view(
        text,
        text_b,
        kind=kind,
        model=loaded,
        layer=layer,
        head=head,
        theme=theme,
        weights=weights,
        target=target,
        attention_set=attention,
    )
    written = page.save(target_file)
    size_mb = written.stat().st_size / 1e6
    out.print(
        f"Wrote the {kind} view of {page.token_count} to {written} ({size_mb:.2f} MB).", highlight=False
    )
    if open_:
        webbrowser.open(written.resolve().as_uri())


@app.command()
def relevance(
    text: TextArgument,
    text_b: TextBArgument = None,
    model: ModelOption = "default",
    method: Annotated[
        Literal["rollout", "flow", "both"], typer.Option("--method", help="rollout, flow or both.")
    ] = "both",
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Longest input flow accepts (its time grows about as n^4).")
    ] = FLOW_MAX_TOKENS,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="HTML file to write; the JSON goes beside it.")
    ] = Path("relevance.html"),
    weights: WeightsOption = "attention",
) -> None:
    """Attention rollout and flow (Abnar and Zuidema 2020) of TEXT as a model view, plus a JSON file
    beside the page: {model, tokens, formula, attention, rollout, flow}, each matrix [layers][n][n]
    (row: token at that layer's output, column: input token; flow rows not normalised)."""
    from bertology.analysis.relevance import RELEVANCE_METHODS, flow_pair_count
    from bertology.capture import capture
    from bertology.outputs import check_output_file
    from bertology.views.relevance import relevance_view

    methods = RELEVANCE_METHODS if method == "both" else (method,)
    check_output_file(output, beside=(".json",))
    attention = capture(text, text_b, model=model, weights=weights)
    n = len(attention.tokens)
    pairs = flow_pair_count(attention.num_layers, n) if "flow" in methods else 0
    with _progress("Attention flow (max-flow problems)", pairs) as on_progress:
        page = relevance_view(attention, methods, max_tokens=max_tokens, on_progress=on_progress)
    html_path = page.save(output)
    json_path = page.save_json(output.with_suffix(".json"))
    out.print(
        f"Wrote the {' and '.join(methods)} of {n} tokens to {html_path} and {json_path}.", highlight=False
    )


@app.command()
def analyze(
    corpus: Annotated[
        Path, typer.Argument(help="Plain text (a paragraph per line), .jsonl or .conllu file.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html, CSV and plots.")],
    model: ModelOption = "default",
    max_len: Annotated[
        int, typer.Option("--max-len", help="Tokens per segment, special tokens included.")
    ] = 128,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Analyse at most this many segments.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for token sampling and the head map.")] = 0,
    batch_size: SegmentBatchOption = BATCH_SIZE,
    corpus_format: Annotated[
        CorpusFormat | None,
        typer.Option("--format", help="text, jsonl or conllu (default: from the file name)."),
    ] = None,
    js_tokens: Annotated[
        int,
        typer.Option(
            "--js-tokens",
            min=0,
            help="Query tokens sampled per segment for the heads' mean JS divergences (seeded); 0 = every "
            "token.",
        ),
    ] = JS_TOKENS_PER_SEGMENT,
    weights: WeightsOption = "attention",
    convention: ConventionOption = "bertology",
) -> None:
    """Per-head statistics, pattern labels and head clustering over CORPUS, written as an HTML report."""
    from bertology.allocator import keep_freed_memory
    from bertology.analyze import analyze_corpus
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.report.analysis import JS_DIVERGENCE_FILE, save_analysis

    check_output_folder(output)
    loaded = load_model(model)
    keep_freed_memory()  # each batch reuses the buffers the last one freed (this process only)
    with _progress("Analysing segments", limit) as on_progress:
        analysis = analyze_corpus(
            corpus,
            loaded,
            max_length=max_len,
            limit=limit,
            seed=seed,
            batch_size=batch_size,
            js_tokens_per_segment=js_tokens or None,
            corpus_format=corpus_format,
            weights=weights,
            convention=convention,
            on_progress=on_progress,
        )
    if analysis.truncated_segments:
        err.print(
            f"[yellow]Warning:[/yellow] {analysis.truncated_segments} segments were longer than "
            f"{max_len} tokens; {analysis.tokens_cut} tokens were cut in all.",
            highlight=False,
        )
    with output_folder(output) as folder:
        report = output / save_analysis(analysis, loaded, folder).name
    out.print(
        f"Analysed {analysis.segments} segments in {analysis.seconds:.1f} s. Wrote {report}, "
        f"{output / 'heads.csv'}, {output / JS_DIVERGENCE_FILE} and the plots in {output / 'plots'}.",
        highlight=False,
    )


def _ablation_of(name: str, side: str, task_dir: Path, max_dev: int) -> AblationResult | str:
    """Model ``name``'s single-head ablation on the task, or why it has none (not a fine-tuned classifier)."""
    from bertology.errors import BertologyError
    from bertology.interventions.run import single_head_ablation
    from bertology.models import load_model

    try:
        classifier = load_model(name, classifier=True)
    except BertologyError as error:
        return str(error)
    with _progress(f"Ablating the heads of model {side}", None) as on_progress:
        return single_head_ablation(classifier, task_dir, max_dev=max_dev or None, progress=on_progress)


@app.command()
def compare(
    model_a: Annotated[str, typer.Argument(help="'default', a hub name, a model folder or a run folder.")],
    model_b: Annotated[str, typer.Argument(help="The model to compare with, e.g. MODEL_A's fine-tuned run.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html, CSV, JSON, plots.")],
    corpus: Annotated[
        Path | None,
        typer.Option(
            "--corpus",
            help="Plain text, .jsonl or .conllu file both models read (default: the sample corpus).",
        ),
    ] = None,
    task_dir: Annotated[
        Path | None, typer.Option("--task", help="GLUE-style task folder: also ablate each head of both.")
    ] = None,
    text: Annotated[
        str | None,
        typer.Option(
            "--text", help="Input of the side-by-side views (default: first segment).", callback=_utf8_text
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Compare at most this many segments.")
    ] = None,
    max_dev: Annotated[
        int, typer.Option("--max-dev", min=0, help="Dev examples scored for --task (0: all).")
    ] = 100,
    max_len: Annotated[
        int, typer.Option("--max-len", help="Tokens per segment, special tokens included.")
    ] = 128,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the sampled query tokens.")] = 0,
    batch_size: SegmentBatchOption = BATCH_SIZE,
    js_tokens: Annotated[
        int,
        typer.Option(
            "--js-tokens", min=0, help="Query tokens sampled per segment for the JS divergences; 0 = all."
        ),
    ] = JS_TOKENS_PER_SEGMENT,
    top: Annotated[int, typer.Option("--top", min=1, help="Most changed heads listed.")] = 10,
    weights: WeightsOption = "attention",
    convention: ConventionOption = "bertology",
    level: Annotated[
        Level,
        typer.Option(
            "--level", help="Compare rows of tokens, of words, or auto (tokens when the tokenizers agree)."
        ),
    ] = "auto",
) -> None:
    """Compare two models head by head: statistics, labels and confidence side by side, heads matched by mean
    JS divergence, both models' head views of one input and, with --task, both ablation pictures."""
    from bertology.allocator import keep_freed_memory
    from bertology.comparison import compare_models, first_segment
    from bertology.corpus import sample_corpus
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.readers.glue import read_glue
    from bertology.report.comparison import write_comparison_report
    from bertology.views import head_view

    check_output_folder(output)
    if task_dir is not None:
        read_glue(task_dir, max_dev=max_dev or None)  # a bad task folder is reported before the work
    corpus = corpus or sample_corpus()
    loaded_a, loaded_b = load_model(model_a), load_model(model_b)
    keep_freed_memory()  # each batch reuses the buffers the last one freed (this process only)
    with _progress("Comparing segments", limit) as on_progress:
        comparison = compare_models(
            loaded_a,
            loaded_b,
            corpus,
            max_length=max_len,
            limit=limit,
            seed=seed,
            batch_size=batch_size,
            js_tokens_per_segment=js_tokens or None,
            level=level,
            weights=weights,
            convention=convention,
            on_progress=on_progress,
        )
    segment = None if text is not None else first_segment(corpus, loaded_a, max_length=max_len)
    texts = (text, None) if segment is None else (segment.text_a, segment.text_b)
    views = (
        head_view(*texts, model=loaded_a, weights=weights),
        head_view(*texts, model=loaded_b, weights=weights),
    )
    ablations = None
    if task_dir is not None:
        ablations = (
            _ablation_of(model_a, "A", task_dir, max_dev),
            _ablation_of(model_b, "B", task_dir, max_dev),
        )
    shown = " ‖ ".join(part if isinstance(part, str) else " ".join(part) for part in texts if part)
    with output_folder(output) as folder:
        written = write_comparison_report(
            comparison, folder, views=views, input_text=shown, ablations=ablations, top=top
        )
    report = output / written.name
    pairs = comparison.most_changed(3)
    changed = ", ".join(
        f"{int(row.layer_a)}-{int(row.head_a)} → {int(row.layer_b)}-{int(row.head_b)} "
        f"({row.js_divergence:.3f} nats)"
        for row in pairs.itertuples()
    )
    out.print(
        f"Compared {comparison.a.segments} segments at the {comparison.level} level in "
        f"{comparison.seconds:.1f} s; most changed heads: {changed}. Wrote {report}, "
        f"{output / 'views.html'}, {output / 'comparison.csv'}, {output / 'comparison.json'} and the plots "
        f"in {output / 'plots'}.",
        highlight=False,
    )


probe_app = typer.Typer(
    help="Linguistic probes: heads that track dependency relations, an attention-only parser.",
    no_args_is_help=True,
)
app.add_typer(probe_app, name="probe")

TreebankFormatOption = Annotated[
    TreebankFormat | None, typer.Option("--format", help="conllu or conllx (default: from the file name).")
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
        int | None, typer.Option("--limit", min=1, help="Probe at most this many sentences.")
    ] = None,
) -> None:
    """Which heads track which dependency relations, against fixed-offset baselines (Clark et al. 2019)."""
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import probe_dependencies
    from bertology.report.probes import write_dependency_report

    check_output_folder(output)
    loaded = load_model(model)
    with _progress("Probing sentences", limit) as on_progress:
        run = probe_dependencies(
            treebank,
            loaded,
            treebank_format=treebank_format,
            mode=word_mode,
            limit=limit,
            on_progress=on_progress,
        )
    with output_folder(output) as folder:
        report = output / write_dependency_report(run, folder).name
    out.print(
        f"Probed {run.sentences} sentences in {run.seconds:.1f} s. Wrote {report}, {output / 'table.csv'} "
        f"and {output / 'accuracies.csv'}.",
        highlight=False,
    )


@probe_app.command("parser")
def probe_parser(
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
) -> None:
    """Clark et al.'s attention-only parser: train on one treebank, UAS without punctuation on another."""
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import train_and_evaluate_parser
    from bertology.report.probes import write_parser_report

    check_output_folder(output)
    loaded = load_model(model)
    err.print("Training the parser and scoring it (this reads both treebanks once)...")
    run = train_and_evaluate_parser(
        train,
        evaluation,
        loaded,
        treebank_format=treebank_format,
        mode=word_mode,
        limit_train=limit_train,
        limit_eval=limit_eval,
        decode=decode,
    )
    with output_folder(output) as folder:
        report = output / write_parser_report(run, folder).name
    scores = run.report
    out.print(
        f"UAS {scores.uas:.3f} (right-branching {scores.right_branching_uas:.3f}, best single head "
        f"{scores.single_head_uas:.3f}) in {run.seconds:.1f} s. Wrote {report} and {output / 'uas.csv'}.",
        highlight=False,
    )


@probe_app.command("coref")
def probe_coref(
    corpus: Annotated[Path, typer.Argument(help="Coreference file or folder (GUM brackets or CoNLL-2012).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html and table.csv.")],
    model: ModelOption = "default",
    treebank: Annotated[
        Path | None,
        typer.Option("--treebank", help="The same documents' trees, for sentences and head words."),
    ] = None,
    coref_format: Annotated[CorefFormat | None, typer.Option("--format", help="gum or conll2012.")] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Probe at most this many documents.")
    ] = None,
) -> None:
    """Antecedent selection per head, by mention type, against nearest, same-head and sieve baselines."""
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import run_coreference
    from bertology.report.probes import write_head_accuracy_report

    check_output_folder(output)
    loaded = load_model(model)
    err.print("Probing coreference, one document window at a time...")
    probe, summary = run_coreference(
        corpus, loaded, treebank=treebank, coref_format=coref_format, limit=limit
    )
    explanation = (
        "A head is right on a coreferent mention when the mention's head word attends most, among the head "
        "words of earlier mentions in the window, to an antecedent's head word (Clark et al. 2019). "
        "Baselines: the nearest earlier mention, the nearest with the same head word, and a rule-based sieve."
    )
    with output_folder(output) as folder:
        written = write_head_accuracy_report(
            folder, title=f"Coreference probe: {loaded.name}", summary=summary, explanation=explanation,
            heatmap=probe.heatmap(), table=probe.table(),
        )  # fmt: skip
    report = output / written.name
    best = probe.best()
    out.print(f"Best head {best.label}: {best.accuracy:.3f}. Wrote {report}.", highlight=False)


@probe_app.command("gap")
def probe_gap_command(
    gap_file: Annotated[Path, typer.Argument(help="GAP tsv (development, validation or test).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.html.")],
    model: ModelOption = "default",
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most this many examples.")] = None,
) -> None:
    """Per head, how often the pronoun attends more to the right name than to the other (GAP)."""
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import run_gap
    from bertology.report.probes import write_head_accuracy_report

    check_output_folder(output)
    loaded = load_model(model)
    probe, summary = run_gap(gap_file, loaded, limit=limit)
    explanation = (
        "For GAP examples where exactly one of the two names is coreferent with the pronoun: the share in "
        "which the pronoun's attention to the right name's words exceeds its attention to the other's."
    )
    with output_folder(output) as folder:
        written = write_head_accuracy_report(
            folder, title=f"GAP probe: {loaded.name}", summary=summary, explanation=explanation,
            heatmap=probe.heatmap(),
        )  # fmt: skip
    report = output / written.name
    best = probe.best()
    out.print(f"Best head {best.label}: {best.accuracy:.3f} over {probe.count} examples. Wrote {report}.")


@app.command()
def serve(
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="A model to serve; repeat for more, the first is the default."),
    ] = None,
    runs: Annotated[
        Path | None, typer.Option("--runs", help="Folder of reports and training runs to browse.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; any but 127.0.0.1 opens it to others.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")] = 8000,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most tokens per input.")] = 512,
    max_body: Annotated[int, typer.Option("--max-body", help="Largest request body, in bytes.")] = 65536,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a request may take.")] = 30.0,
    parallel: Annotated[int, typer.Option("--parallel", help="Computations at once per model.")] = 2,
) -> None:
    """A local web app: type a text, see its views and per-head statistics; browse RUNS; a JSON API."""
    from bertology.server import Limits
    from bertology.server import serve as serve_app

    limits = Limits(max_tokens=max_tokens, max_body_bytes=max_body, timeout_s=timeout, parallel=parallel)
    serve_app(
        model or ["default"],
        runs,
        host=host,
        port=port,
        limits=limits,
        announce=lambda line: out.print(line, highlight=False, markup=False),
    )


_FINETUNE = FinetuneSettings()


@contextmanager
def _training_progress(total: int) -> Iterator[Callable[[TrainingProgress], None]]:
    """A progress bar on stderr showing the optimizer step and the running training loss."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("Fine-tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("train", total=total, loss="–")

        def show(state: TrainingProgress) -> None:
            progress.update(task, total=state.total, completed=state.step, loss=f"{state.loss:.3f}")

        yield show


@app.command()
def finetune(
    task_dir: Annotated[Path, typer.Argument(help="GLUE-style task folder with train.tsv and dev.tsv.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Run folder to write.")],
    model: ModelOption = _FINETUNE.model,
    max_train: Annotated[
        int, typer.Option("--max-train", help="Train on a seeded random sample of this many (0: all).")
    ] = _FINETUNE.max_train or 0,
    max_dev: Annotated[int, typer.Option("--max-dev", help="Evaluate on the first N dev (0: all).")] = 0,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the sample.")] = _FINETUNE.epochs,
    max_len: Annotated[
        int, typer.Option("--max-len", help="Tokens per input, special tokens included.")
    ] = _FINETUNE.max_length,
    batch_size: Annotated[int, typer.Option("--batch-size")] = _FINETUNE.batch_size,
    learning_rate: Annotated[
        float, typer.Option("--lr", help="Peak learning rate.")
    ] = _FINETUNE.learning_rate,
    eval_every: Annotated[
        int, typer.Option("--eval-every", help="Also evaluate every N steps (0: at each epoch's end only).")
    ] = _FINETUNE.eval_every or 0,
    watch_every: Annotated[
        int, typer.Option("--watch-every", help="Record the probe set's attention every S steps (0: never).")
    ] = _FINETUNE.watch_every,
    probe_set: Annotated[
        int, typer.Option("--probe-set", help="Dev examples whose attention is recorded.")
    ] = _FINETUNE.probe_set,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the sample, new head, batches, dropout.")] = 0,
    threads: Annotated[
        int, typer.Option("--threads", help="Torch threads (0: one per core; 1 is faster on a busy machine).")
    ] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run in the folder.")] = False,
) -> None:
    """Fine-tune a classifier on a GLUE-style task, recording how its attention changes (see 'watch')."""
    from bertology.outputs import check_output_folder
    from bertology.training.finetune import finetune as run_finetune

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
    )
    with _training_progress(total=0) as on_progress:
        result = run_finetune(task_dir, output, settings, overwrite=overwrite, on_progress=on_progress)
    out.print(
        f"Fine-tuned {result.train_examples} examples for {result.steps} steps in {result.seconds:.0f} s: "
        f"dev accuracy {result.dev_accuracy:.4f} on {result.dev_examples} examples. Wrote {output} "
        f"(model/, run.json, metrics.csv{', monitor.zarr' if watch_every else ''}).",
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
    from bertology.errors import BertologyError
    from bertology.outputs import check_output_file
    from bertology.training.watch import write_watch

    if not run_dir.is_dir():
        what = "is a file" if run_dir.exists() else "does not exist"
        raise BertologyError(
            f"{run_dir} {what}; give a run folder of 'bertology finetune' or its monitor.zarr archive."
        )
    target = write_watch(run_dir, check_output_file(output or run_dir / "watch.html"))
    size_mb = target.stat().st_size / 1e6
    out.print(f"Wrote {target} ({size_mb:.2f} MB).", highlight=False)
    if open_:
        webbrowser.open(target.resolve().as_uri())


@contextmanager
def _stage_progress() -> Iterator[Callable[[str, int, int], None]]:
    """Progress bars on stderr, one per stage of a long run; yields ``update(stage, done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        stages: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in stages:
                stages[stage] = progress.add_task(stage, total=total)
            progress.update(stages[stage], completed=done)

        yield update


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
        int, typer.Option("--max-dev", min=0, help="Score the first N dev examples (0: all).")
    ] = 0,
    prune: Annotated[
        float,
        typer.Option(
            "--prune",
            min=0.0,
            max=1.0,
            help="Share of heads to remove structurally, least important first (0: none).",
        ),
    ] = 0.5,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Examples per forward pass.")] = 32,
) -> None:
    """Remove heads: each one alone, by importance and by ablation rank, and for real (a smaller model)."""
    from dataclasses import replace

    from bertology.interventions.run import run_ablation
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.report.interventions import write_ablation_report

    check_output_folder(output)
    loaded = load_model(model, classifier=True)
    with output_folder(output) as folder:
        with _stage_progress() as on_progress:
            run = run_ablation(
                loaded,
                task_dir,
                max_dev=max_dev or None,
                batch_size=batch_size,
                prune_fraction=prune,
                pruned_dir=folder / "pruned" if prune else None,
                progress=on_progress,
            )
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
        int, typer.Option("--steps", min=1, help="Integration points of integrated gradients.")
    ] = 50,
) -> None:
    """Which tokens the prediction rests on: gradient, gradient x input and integrated gradients."""
    from bertology.interventions.saliency import explain as explain_prediction
    from bertology.models import load_model
    from bertology.outputs import check_output_file
    from bertology.report.interventions import write_explanation

    check_output_file(output, beside=(".json",))
    loaded = load_model(model, classifier=True)
    explanation = explain_prediction(loaded, text, text_b, steps=steps)
    page_path, json_path = write_explanation(explanation, output)
    out.print(
        f"Predicted {explanation.label!r} (probability {explanation.probability:.3f}); integrated gradients "
        f"miss f(x) - f(baseline) by {explanation.completeness_gap:.2g} (more --steps, less). "
        f"Wrote {page_path} and {json_path}.",
        highlight=False,
    )


@app.command()
def models() -> None:
    """List the supported architectures and the default model."""
    from bertology.models import DEFAULT_LABEL, SUPPORTED_ARCHITECTURES, default_model_path

    table = Table(title="Supported architectures (config.model_type)")
    table.add_column("model_type")
    table.add_column("architecture")
    for model_type, name in SUPPORTED_ARCHITECTURES.items():
        table.add_row(model_type, name)
    out.print(table)
    out.print(f"Default model ('default'): {DEFAULT_LABEL}, 6 layers x 12 heads, at {default_model_path()}")
    out.print("Any other hub name or local directory of a supported architecture also works.")


def main() -> None:
    """Console entry point: user errors become one sentence on stderr and exit code 1."""
    from bertology.errors import BertologyError

    _quiet_libraries()
    try:
        app(standalone_mode=False)
    except BertologyError as error:
        if _State.debug:
            raise
        err.print(f"[red]Error:[/red] {error}", highlight=False)
        sys.exit(1)
    except typer.Abort:
        err.print("Aborted.")
        sys.exit(130)
    except OSError as error:  # a file that could not be read or written after the checks up front
        if _State.debug:
            raise
        where = f" {error.filename}" if error.filename else ""
        err.print(f"[red]Error:[/red] Could not use{where}: {error.strerror or error}.", highlight=False)
        sys.exit(1)
    except typer.TyperException as error:  # usage errors: an unknown option, a value out of range
        show = getattr(error, "show", None)  # typer's click exceptions print the usage line too
        if show is None:
            err.print(f"[red]Error:[/red] {error.format_message()}", highlight=False)
        else:
            show()
        sys.exit(error.exit_code)
    except Exception as error:  # anything unexpected
        if _State.debug:
            raise
        err.print(
            f"[red]Unexpected error:[/red] {type(error).__name__}: {error} (run with --debug for details)"
        )
        sys.exit(2)
