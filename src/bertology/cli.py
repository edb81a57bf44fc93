"""The ``bertology`` command: one subcommand per verb, each a thin call into the library.

Only light modules are imported here (choices and defaults from :mod:`bertology.options`); each command
imports what it runs, so ``bertology --help`` and usage errors answer without loading torch.
"""

from __future__ import annotations

import math
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
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEVICE_FORMS,
    EXAMPLES_PER_HEAD,
    FLOW_MAX_TOKENS,
    JS_TOKENS_PER_SEGMENT,
    MAX_COUNT,
    MAX_IG_STEPS,
    MAX_SEED,
    MAX_THREADS,
    AttentionSetName,
    Convention,
    CorpusFormat,
    Decode,
    Dtype,
    Level,
    Theme,
    ViewKind,
    Weights,
    WordMode,
    is_device_name,
    ray_address_problem,
)
from bertology.readers.coref import CorefFormat
from bertology.readers.treebank import TreebankFormat
from bertology.training.settings import FinetuneSettings, TrainingProgress

if TYPE_CHECKING:
    from bertology.cluster.workers import ClusterOptions
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


def _ray_address(address: str | None) -> str | None:
    """``--ray`` as given, or a usage error for an address of no form Ray takes."""
    if address is not None and (problem := ray_address_problem(address)):
        raise typer.BadParameter(problem)
    return address


def _positive_finite(value: float) -> float:
    """A float option as given, or a usage error unless it is a finite number above 0."""
    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a finite number above 0.")
    return value


def _share_below_one(value: float) -> float:
    """``--prune`` as given (already checked to lie in 0..1), or a usage error for 1: the share of heads
    pruned must be below 1 (:func:`bertology.interventions.run.run_ablation`)."""
    if value >= 1.0:
        raise typer.BadParameter(f"{value} is not below 1; give a share of the heads from 0 up to below 1.")
    return value


RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS|local",
        callback=_ray_address,
        help="Run on a Ray cluster (pip install bertology[ray]): 'local' (one on this machine), 'auto', or "
        "the HOST:PORT (or ray://HOST:PORT) of a cluster started with 'ray start --head'.",
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=1,
        max=MAX_THREADS,
        help="With --ray: workers, each with its own copy of the model (default: CPUs / threads per worker).",
    ),
]
ThreadsPerWorkerOption = Annotated[
    int,
    typer.Option(
        "--threads-per-worker", min=1, max=MAX_THREADS, help="With --ray: torch threads of each worker."
    ),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="With --ray: continue from the checkpoint an interrupted run left in the output folder.",
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


def _device_name(name: str) -> str:
    """``--device`` as given, or a usage error for a name of no known form (whether the device is there is
    checked when the model loads)."""
    if not is_device_name(name):
        raise typer.BadParameter(f"'{name}' is not a device; use one of {DEVICE_FORMS}.")
    return name


DeviceOption = Annotated[
    str,
    typer.Option(
        "--device",
        metavar=DEVICE_FORMS,
        callback=_device_name,
        help="Where the model runs: auto (a CUDA GPU if there is one, else an Apple GPU, else the CPU), cpu, "
        "cuda, cuda:N or mps.",
    ),
]
DtypeOption = Annotated[
    Dtype,
    typer.Option(
        "--dtype",
        help="Precision of the model's forward pass: float32, bfloat16 or float16 (statistics are summed in "
        "float64 either way).",
    ),
]


TextArgument = Annotated[str, typer.Argument(help="The text (text A of a pair).", callback=_utf8_text)]
TextBArgument = Annotated[
    str | None,
    typer.Argument(help="Optional second text (text B of a pair).", callback=_utf8_text),
]


class _State:
    debug = False


#: The exit code of a run stopped by Ctrl-C (SIGINT), as shells report it (128 + 2).
INTERRUPTED_EXIT = 130


class _Interrupted(Exception):
    """A run stopped by Ctrl-C; the message says what was kept (exit code :data:`INTERRUPTED_EXIT`)."""


@contextmanager
def _resumable(checkpoint: Path) -> Iterator[None]:
    """Ctrl-C during the block (a Ray run keeping ``checkpoint``) becomes :class:`_Interrupted`, saying
    that ``--resume`` continues from the checkpoint the run saved as it stopped."""
    try:
        yield
    except KeyboardInterrupt:
        if not checkpoint.is_file():
            raise _Interrupted("stopped by Ctrl-C before any work was saved.") from None
        raise _Interrupted(
            f"stopped by Ctrl-C; the work done is kept in {checkpoint}, and the same command with --resume "
            "continues it."
        ) from None


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
def _progress(what: str, total: int | None, *, rate: str | None = None) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr for long work; yields the callback that reports how many are done (and,
    as a second argument, the total once it is known). rate: also show the speed, in ``rate`` per second."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class Speed(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text("" if task.speed is None else f"{task.speed:,.1f} {rate}/s")

    columns = [TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, *([Speed()] if rate else []), console=err, transient=True) as progress:
        task = progress.add_task(what, total=total)
        yield lambda done, total=None: progress.update(task, completed=done, total=total)


@app.command()
def view(
    text: TextArgument,
    text_b: TextBArgument = None,
    model: ModelOption = "default",
    kind: Annotated[ViewKind, typer.Option("--view", "-v", help="head, model or neuron.")] = "head",
    layer: Annotated[int, typer.Option("--layer", "-l", help="Layer shown first (0-based).")] = 0,
    head: Annotated[int, typer.Option("--head", help="Head shown first in the neuron view (0-based).")] = 0,
    query: Annotated[
        int,
        typer.Option(
            "--query",
            help="Query token of the neuron view; a long input's window is centred on it (0-based).",
        ),
    ] = 0,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            min=1,
            help="Most tokens read (default: the model's own limit; over 1,024 the long-input views).",
        ),
    ] = None,
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
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Write a head, model or neuron view of TEXT (or the pair TEXT TEXT_B, or for an encoder-decoder model
    the source TEXT and --target) as one self-contained page."""
    from bertology.models import load_model
    from bertology.outputs import check_output_file
    from bertology.views import render_view

    target_file = check_output_file(output or Path(f"{kind}_view.html"))
    loaded = load_model(model, device=device, dtype=dtype)
    page = render_view(
        text,
        text_b,
        kind=kind,
        model=loaded,
        layer=layer,
        head=head,
        query=query,
        theme=theme,
        weights=weights,
        target=target,
        attention_set=attention,
        max_tokens=max_tokens,
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
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Attention rollout and flow (Abnar and Zuidema 2020) of TEXT as a model view, plus a JSON file
    beside the page: {model, tokens, formula, attention, rollout, flow}, each matrix [layers][n][n]
    (row: token at that layer's output, column: input token; flow rows not normalised)."""
    from bertology.analysis.relevance import JSON_MARKS, RELEVANCE_METHODS, flow_pair_count
    from bertology.attention import capture
    from bertology.models import load_model
    from bertology.outputs import check_output_file
    from bertology.views.relevance import relevance_view

    methods = RELEVANCE_METHODS if method == "both" else (method,)
    check_output_file(output, beside=(".json",), marks=JSON_MARKS)
    loaded = load_model(model, device=device, dtype=dtype)
    attention = capture(text, text_b, model=loaded, weights=weights)
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
        int,
        typer.Option(
            "--max-len",
            help="Tokens per segment, special tokens included, up to the model's own limit (over 1,024: "
            "computed from queries and keys, in bounded memory).",
        ),
    ] = 128,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, max=MAX_COUNT, help="Analyse at most this many segments."),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed for token sampling and the head map.")
    ] = 0,
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
    examples_per_head: Annotated[
        int,
        typer.Option(
            "--examples-per-head",
            min=0,
            help="Top example segments stored per head, with its attention (8-bit), for `bertology serve "
            "--runs`; 0: none.",
        ),
    ] = EXAMPLES_PER_HEAD,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
    resume: ResumeOption = False,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Per-head statistics, pattern labels and head clustering over CORPUS, written as an HTML report."""
    cluster = _cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    from bertology.allocator import keep_freed_memory
    from bertology.analyze import analyze_corpus
    from bertology.cluster.analyze import AnalysisJob, analyze_on_ray
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.models import load_model, require_max_length
    from bertology.outputs import check_output_folder, output_folder
    from bertology.report.analysis import save_analysis
    from bertology.run_files import JS_DIVERGENCE_FILE

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    require_max_length(loaded, max_len)
    checkpoint = checkpoint_file(output, "analyze")
    settings = {  # of the statistics: the local run takes them, a Ray run's job carries them to the workers
        "max_length": max_len,
        "seed": seed,
        "js_tokens_per_segment": js_tokens or None,
        "weights": weights,
        "convention": convention,
        "examples_per_head": examples_per_head,
    }
    with _progress("Analysing segments", limit, rate="segments") as on_progress:
        reading = {
            "limit": limit,
            "batch_size": batch_size,
            "corpus_format": corpus_format,
            "on_progress": on_progress,
        }
        if cluster is None:
            keep_freed_memory()  # each batch reuses the buffers the last one freed (this process only)
            analysis = analyze_corpus(corpus, loaded, **settings, **reading)
        else:
            job = AnalysisJob(model, **settings, device=device, dtype=dtype)
            with _resumable(checkpoint):
                analysis = analyze_on_ray(
                    corpus, loaded, job, cluster, **reading, checkpoint=checkpoint, resume=resume
                )
    if analysis.truncated_segments:
        err.print(
            f"[yellow]Warning:[/yellow] {analysis.truncated_segments} segments were longer than "
            f"{max_len} tokens; {analysis.tokens_cut} tokens were cut in all.",
            highlight=False,
        )
    with output_folder(output) as folder:
        report = output / save_analysis(analysis, loaded, folder).name
    checkpoint.unlink(missing_ok=True)  # the run is written; nothing is left to resume
    out.print(
        f"Analysed {analysis.segments} segments in {analysis.seconds:.1f} s. Wrote {report}, "
        f"{output / 'heads.csv'}, {output / JS_DIVERGENCE_FILE} and the plots in {output / 'plots'}.",
        highlight=False,
    )


@app.command()
def index(
    corpus: Annotated[
        Path, typer.Argument(help="A treebank (.conllu, .conll: relations kept), plain text or .jsonl file.")
    ],
    output: Annotated[
        Path,
        typer.Option(
            "-o", "--output", help="Folder of the token index: new, empty, or an index to replace whole."
        ),
    ],
    model: ModelOption = "default",
    layers: Annotated[
        str | None,
        typer.Option(
            "--layers",
            help="Comma-separated 0-based layers to index (default: three, the last one included).",
        ),
    ] = None,
    max_len: Annotated[int, typer.Option("--max-len", min=8, help="Tokens per segment at most.")] = 128,
    batch_size: SegmentBatchOption = BATCH_SIZE,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Index every token's contextual vector of CORPUS at a few layers, for corpus search in `bertology serve
    --index DIR` (exBERT's idea)."""
    try:  # a usage error before torch loads
        chosen = None if layers is None else [int(layer) for layer in layers.split(",") if layer.strip()]
    except ValueError as error:
        raise typer.BadParameter("--layers takes layer numbers separated by commas, e.g. 1,3,5.") from error
    from bertology.index_store import check_index_folder
    from bertology.models import load_model, require_max_length
    from bertology.token_index import build_index

    check_index_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    require_max_length(loaded, max_len)
    with _progress("Indexing the corpus", None):
        built = build_index(
            corpus, output, model=loaded, layers=chosen, batch_size=batch_size, max_length=max_len
        )
    out.print(
        f"Indexed {len(built)} tokens of {len(built.segments)} segments at layers "
        f"{', '.join(map(str, built.layers))} in {output}.",
        highlight=False,
    )


def _cluster_options(
    address: str | None, workers: int | None, threads_per_worker: int, resume: bool
) -> ClusterOptions | None:
    """The Ray cluster a command runs on (``None``: this process), or a usage error for Ray options given
    without ``--ray``."""
    from bertology.allocator import keep_freed_memory
    from bertology.cluster.workers import ClusterOptions

    if address is None:
        if workers is not None or threads_per_worker != 1 or resume:
            raise typer.BadParameter("--workers, --threads-per-worker and --resume apply only with --ray.")
        return None
    # each worker process is the run's own: its batches reuse the buffers the last one freed
    return ClusterOptions(address, workers, threads_per_worker, setup=keep_freed_memory)


def _ablation_of(
    name: str, side: str, task_dir: Path, max_dev: int, device: str, dtype: Dtype
) -> AblationResult | str:
    """Model ``name``'s single-head ablation on the task, or why it has none (not a fine-tuned classifier)."""
    from bertology.errors import BertologyError
    from bertology.interventions.run import single_head_ablation
    from bertology.models import load_model

    try:
        classifier = load_model(name, classifier=True, device=device, dtype=dtype)
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
        int | None,
        typer.Option("--limit", min=1, max=MAX_COUNT, help="Compare at most this many segments."),
    ] = None,
    max_dev: Annotated[
        int, typer.Option("--max-dev", min=0, max=MAX_COUNT, help="Dev examples scored for --task (0: all).")
    ] = 100,
    max_len: Annotated[
        int, typer.Option("--max-len", min=1, help="Tokens per segment, special tokens included.")
    ] = 128,
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed for the sampled query tokens.")
    ] = 0,
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
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
    resume: ResumeOption = False,
) -> None:
    """Compare two models head by head: statistics, labels and confidence side by side, heads matched by mean
    JS divergence, both models' head views of one input and, with --task, both ablation pictures."""
    cluster = _cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    from bertology.allocator import keep_freed_memory
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.cluster.compare import ComparisonJob, compare_on_ray
    from bertology.comparison import compare_models, first_segment
    from bertology.corpus import sample_corpus
    from bertology.models import load_model, require_max_length
    from bertology.outputs import check_output_folder, output_folder
    from bertology.readers.glue import read_glue
    from bertology.report.comparison import write_comparison_report
    from bertology.views import head_view

    check_output_folder(output)
    if task_dir is not None:
        read_glue(task_dir, max_dev=max_dev or None)  # a bad task folder is reported before the work
    corpus = corpus or sample_corpus()
    loaded_a, loaded_b = (load_model(name, device=device, dtype=dtype) for name in (model_a, model_b))
    for loaded in (loaded_a, loaded_b):
        require_max_length(loaded, max_len)
    checkpoint = checkpoint_file(output, "compare")
    settings = {  # of the statistics: the local run takes them, a Ray run's job carries them to the workers
        "max_length": max_len,
        "seed": seed,
        "js_tokens_per_segment": js_tokens or None,
        "level": level,
        "weights": weights,
        "convention": convention,
    }
    with _progress("Comparing segments", limit, rate="segments") as on_progress:
        reading = {"limit": limit, "batch_size": batch_size, "on_progress": on_progress}
        if cluster is None:
            keep_freed_memory()  # each batch reuses the buffers the last one freed (this process only)
            comparison = compare_models(loaded_a, loaded_b, corpus, **settings, **reading)
        else:
            job = ComparisonJob(model_a, model_b, **settings, device=device, dtype=dtype)
            with _resumable(checkpoint):
                comparison = compare_on_ray(
                    corpus, loaded_a, loaded_b, job, cluster, **reading, checkpoint=checkpoint, resume=resume
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
            _ablation_of(model_a, "A", task_dir, max_dev, device, dtype),
            _ablation_of(model_b, "B", task_dir, max_dev, device, dtype),
        )
    shown = " ‖ ".join(part if isinstance(part, str) else " ".join(part) for part in texts if part)
    with output_folder(output) as folder:
        written = write_comparison_report(
            comparison, folder, views=views, input_text=shown, ablations=ablations, top=top
        )
    checkpoint.unlink(missing_ok=True)  # the run is written; nothing is left to resume
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
        typer.Option("--limit", min=1, max=MAX_COUNT, help="Probe at most this many sentences."),
    ] = None,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
    resume: ResumeOption = False,
) -> None:
    """Which heads track which dependency relations, against fixed-offset baselines (Clark et al. 2019)."""
    cluster = _cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.cluster.probes import DependencyJob, probe_dependencies_on_ray
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import probe_dependencies
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    checkpoint = checkpoint_file(output, "probe-deps")
    with _progress("Probing sentences", limit, rate="sentences") as on_progress:
        reading = {"treebank_format": treebank_format, "limit": limit, "on_progress": on_progress}
        if cluster is None:
            run = probe_dependencies(treebank, loaded, mode=word_mode, **reading)
        else:
            job = DependencyJob(model, word_mode, device=device, dtype=dtype)
            with _resumable(checkpoint):
                run = probe_dependencies_on_ray(
                    treebank, loaded, job, cluster, **reading, checkpoint=checkpoint, resume=resume
                )
    with output_folder(output) as folder:
        report = output / write_probe_report(run, folder).name
    checkpoint.unlink(missing_ok=True)  # the run is written; nothing is left to resume
    out.print(
        f"Probed {run.sentences} sentences in {run.seconds:.1f} s. Wrote {report}, {output / 'table.csv'} "
        f"and {output / 'accuracies.csv'}.",
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
        int | None, typer.Option("--limit-train", min=1, max=MAX_COUNT, help="Train on the first N.")
    ] = None,
    limit_eval: Annotated[
        int | None, typer.Option("--limit-eval", min=1, max=MAX_COUNT, help="Score the first N.")
    ] = None,
    decode: Annotated[
        Decode, typer.Option(help="argmax (per word) or mst (Chu-Liu/Edmonds tree).")
    ] = "argmax",
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Clark et al.'s attention-only parser: train on one treebank, UAS without punctuation on another."""
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import probe_parser
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    err.print("Training the parser and scoring it (this reads both treebanks once)...")
    run = probe_parser(
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
        report = output / write_probe_report(run, folder).name
    scores = run.report
    out.print(
        f"UAS {scores.uas:.3f} (right-branching {scores.right_branching_uas:.3f}, best single head "
        f"{scores.single_head_uas:.3f}) in {run.seconds:.1f} s. Wrote {report} and {output / 'uas.csv'}.",
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
        typer.Option("--limit", min=1, max=MAX_COUNT, help="Probe at most this many documents."),
    ] = None,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    ray: RayOption = None,
    workers: WorkersOption = None,
    threads_per_worker: ThreadsPerWorkerOption = 1,
    resume: ResumeOption = False,
) -> None:
    """Antecedent selection per head, by mention type, against nearest, same-head and sieve baselines."""
    cluster = _cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.cluster.probes import CorefJob, probe_coreference_on_ray
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import probe_coreference
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    checkpoint = checkpoint_file(output, "probe-coref")
    reading = {"treebank": treebank, "coref_format": coref_format, "limit": limit}
    if cluster is None:
        err.print("Probing coreference, one document window at a time...")
        run = probe_coreference(corpus, loaded, **reading)
    else:
        with (
            _progress("Probing coreference windows", None, rate="windows") as on_progress,
            _resumable(checkpoint),
        ):
            run = probe_coreference_on_ray(
                corpus, loaded, CorefJob(model, device=device, dtype=dtype), cluster,
                checkpoint=checkpoint, resume=resume, on_progress=on_progress, **reading,
            )  # fmt: skip
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
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, max=MAX_COUNT, help="At most this many examples.")
    ] = None,
    syntax: Annotated[
        bool, typer.Option("--syntax/--no-syntax", help="Syntactic baselines from spaCy parses, if any.")
    ] = True,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """GAP's scorecard (P/R/F1 overall, masculine, feminine, bias F/M) for every head and GAP's baselines."""
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.probes.run import probe_gap
    from bertology.report.probes import write_probe_report

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    run = probe_gap(gap_file, loaded, limit=limit, syntax=syntax)
    with output_folder(output) as folder:
        report = output / write_probe_report(run, folder).name
    best = run.table().iloc[0]
    out.print(
        f"Best head {best['system'].removeprefix('head ')}: F1 {best['overall_f1']:.3f} (masculine "
        f"{best['masculine_f1']:.3f}, feminine {best['feminine_f1']:.3f}, bias F/M {best['bias_f_m']:.2f}) "
        f"over {run.probe.examples} examples. Wrote {report} and {output / 'table.csv'}.",
        highlight=False,
    )


@app.command()
def serve(
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="A model to serve; repeat for more, the first is the default."),
    ] = None,
    runs: Annotated[
        Path | None, typer.Option("--runs", help="Folder of reports and training runs to browse.")
    ] = None,
    corpus_index: Annotated[
        Path | None,
        typer.Option("--index", help="A corpus index folder (`bertology index`) for corpus search."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; any but 127.0.0.1 opens it to others.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")] = 8000,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most tokens per input.")] = 512,
    max_body: Annotated[int, typer.Option("--max-body", help="Largest request body, in bytes.")] = 65536,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a request may take.")] = 30.0,
    parallel: Annotated[int, typer.Option("--parallel", help="Computations at once per model.")] = 2,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
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
        device=device,
        dtype=dtype,
        index=corpus_index,
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
        int,
        typer.Option(
            "--max-train", min=0, max=MAX_COUNT, help="Train on a seeded random sample of this many (0: all)."
        ),
    ] = _FINETUNE.max_train or 0,
    max_dev: Annotated[
        int, typer.Option("--max-dev", min=0, max=MAX_COUNT, help="Evaluate on the first N dev (0: all).")
    ] = 0,
    epochs: Annotated[
        int, typer.Option("--epochs", min=1, max=MAX_COUNT, help="Passes over the sample.")
    ] = _FINETUNE.epochs,
    max_len: Annotated[
        int, typer.Option("--max-len", min=1, help="Tokens per input, special tokens included.")
    ] = _FINETUNE.max_length,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=MAX_COUNT, help="Examples per optimizer step.")
    ] = _FINETUNE.batch_size,
    learning_rate: Annotated[
        float, typer.Option("--lr", callback=_positive_finite, help="Peak learning rate (above 0).")
    ] = _FINETUNE.learning_rate,
    eval_every: Annotated[
        int,
        typer.Option(
            "--eval-every",
            min=0,
            max=MAX_COUNT,
            help="Also evaluate every N steps (0: at each epoch's end only).",
        ),
    ] = _FINETUNE.eval_every or 0,
    watch_every: Annotated[
        int,
        typer.Option(
            "--watch-every",
            min=0,
            max=MAX_COUNT,
            help="Record the probe set's attention every S steps (0: never).",
        ),
    ] = _FINETUNE.watch_every,
    probe_set: Annotated[
        int,
        typer.Option("--probe-set", min=1, max=MAX_COUNT, help="Dev examples whose attention is recorded."),
    ] = _FINETUNE.probe_set,
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
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run in the folder.")] = False,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Fine-tune a classifier on a GLUE-style task, recording how its attention changes (see 'watch')."""
    from bertology.outputs import check_output_folder
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
    from bertology.readers import file_problem
    from bertology.training.watch import write_watch

    if not run_dir.is_dir():
        what = file_problem(run_dir) or "is a file"
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
        int, typer.Option("--max-dev", min=0, max=MAX_COUNT, help="Score the first N dev examples (0: all).")
    ] = 0,
    prune: Annotated[
        float,
        typer.Option(
            "--prune",
            min=0.0,
            max=1.0,
            callback=_share_below_one,
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
    cluster = _cluster_options(ray, workers, threads_per_worker, False)  # a usage error before torch loads
    from dataclasses import replace

    from bertology.cluster.ablation import AblationJob, ablate_on_ray
    from bertology.interventions.run import run_ablation
    from bertology.models import load_model
    from bertology.outputs import check_output_folder, output_folder
    from bertology.report.interventions import write_ablation_report

    check_output_folder(output)
    loaded = load_model(model, classifier=True, device=device, dtype=dtype)
    with output_folder(output) as folder:
        pruned_dir = folder / "pruned" if prune else None
        with _stage_progress() as on_progress:
            study = {"prune_fraction": prune, "pruned_dir": pruned_dir, "progress": on_progress}
            if cluster is None:
                run = run_ablation(loaded, task_dir, max_dev=max_dev or None, batch_size=batch_size, **study)
            else:
                # workers start elsewhere: folders by their absolute paths
                classifier = str(Path(model).resolve()) if Path(model).exists() else model
                task = str(task_dir.resolve())
                job = AblationJob(classifier, task, max_dev or None, batch_size, device=device, dtype=dtype)
                run = ablate_on_ray(loaded, job, cluster, **study)
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


@app.command()
def models() -> None:
    """List the supported model types with their kind, capture route and features, and the default model."""
    from bertology.model_store import PACKAGED_MODELS, assembled_path
    from bertology.model_types import FEATURES, MODEL_TYPES, REFUSED, features
    from bertology.models import DEFAULT_LABEL, default_model_path

    table = Table(title="Supported model types (config.model_type)")
    for column in ("model_type", "name", "kind", "route"):
        table.add_column(column, no_wrap=True)
    table.add_column(f"features (of: {', '.join(FEATURES)})")
    for model_type, entry in MODEL_TYPES.items():
        has = ", ".join(name for name, present in features(model_type).items() if present)
        table.add_row(model_type, entry.name, entry.kind, entry.route, has)
    out.print(table)
    for model_type, reason in REFUSED.items():
        out.print(f"Not supported: {model_type}, which {reason}.", highlight=False)
    out.print(f"Default model ('default'): {DEFAULT_LABEL}, 6 layers x 12 heads, at {default_model_path()}")
    for name in PACKAGED_MODELS:
        folder = assembled_path(name)
        where = f"at {folder}" if folder else "assembled from its PyPI parts at first use (make real-models)"
        out.print(f"Real model ('{name}'): {where}", highlight=False)
    out.print("Any other hub name or local directory of a supported architecture also works.")


def main() -> None:
    """Console entry point: user errors become one sentence on stderr and exit code 1."""
    from bertology.errors import BertologyError

    _quiet_libraries()
    try:
        code = app(standalone_mode=False)
    except _Interrupted as error:
        err.print(f"[red]Interrupted:[/red] {error}", highlight=False)
        sys.exit(INTERRUPTED_EXIT)
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
    except MemoryError:
        if _State.debug:
            raise
        err.print("[red]Error:[/red] Out of memory; give smaller inputs or a smaller --batch-size.")
        sys.exit(1)
    except Exception as error:  # anything unexpected
        if _State.debug:
            raise
        err.print(
            f"[red]Unexpected error:[/red] {type(error).__name__}: {error} (run with --debug for details)"
        )
        sys.exit(2)
    if code == INTERRUPTED_EXIT:  # typer's answer to Ctrl-C (KeyboardInterrupt) outside a Ray run
        err.print("[red]Interrupted:[/red] stopped by Ctrl-C; nothing more was written.", highlight=False)
        sys.exit(INTERRUPTED_EXIT)
