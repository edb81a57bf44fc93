"""``bertology analyze``, ``index``, ``compare`` and ``heads``: commands that stream a corpus through
models."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bertology.options import (
    BATCH_SIZE,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    EXAMPLES_PER_HEAD,
    JS_TOKENS_PER_SEGMENT,
    MAX_NEW_TOKENS,
    MAX_SEED,
    CorpusFormat,
    Dtype,
    Level,
)

if TYPE_CHECKING:
    from bertology.corpus.cache import CacheUse
    from bertology.interventions.ablation import AblationResult
from bertology.cli.app import app, err, out, resumable
from bertology.cli.options import (
    ConventionOption,
    DeviceOption,
    DtypeOption,
    ModelOption,
    NoCacheOption,
    RayOption,
    ReadersOption,
    ResumeOption,
    SegmentBatchOption,
    ThreadsPerWorkerOption,
    WeightsOption,
    WorkersOption,
    cluster_options,
    require_corpus,
    require_task,
    utf8_text,
)
from bertology.cli.progress import progress_bar


def say_cache_use(use: CacheUse) -> None:
    """One line on how a run's segments came through the encoded-corpus cache (none when it was off)."""
    if sentence := use.sentence():
        out.print(sentence, highlight=False)


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
        typer.Option("--limit", min=1, help="Analyse at most this many segments."),
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
    no_cache: NoCacheOption = False,
    readers: ReadersOption = None,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens",
            min=1,
            help="Encoder-decoders: the longest greedy output the decoder reads for a source without a "
            f"target (default {MAX_NEW_TOKENS}).",
        ),
    ] = None,
) -> None:
    """Per-head statistics, pattern labels and head clustering over CORPUS, written as an HTML report
    (an encoder-decoder's: its encoder, decoder and cross-attention, sources with optional targets)."""
    cluster = cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    require_corpus("CORPUS", corpus, corpus_format)
    from bertology.models.loading import model_kind
    from bertology.models.model_types import KIND_PHRASES

    given = {  # the options of the encoder and decoder analysis, given with another value than the default
        "--js-tokens": js_tokens != JS_TOKENS_PER_SEGMENT,
        "--weights": weights != "attention",
        "--convention": convention != "bertology",
        "--examples-per-head": examples_per_head != EXAMPLES_PER_HEAD,
        "--ray / --workers": cluster is not None,
        "--readers": readers is not None,
    }
    kind = model_kind(model)
    if kind == "encoder-decoder":
        require_single_stack_options(model, given)
        _analyze_encoder_decoder(
            corpus, output, model, max_len, limit, batch_size, corpus_format, max_new_tokens, device, dtype
        )
        return
    if max_new_tokens is not None:
        from bertology.errors import BertologyError

        raise BertologyError(
            f"--max-new-tokens is for encoder-decoder models; '{model}' is {KIND_PHRASES[kind]} model."
        )
    from bertology.allocator import keep_freed_memory
    from bertology.analysis.analyze import analyze_corpus
    from bertology.analysis.settings import AnalysisSettings
    from bertology.cluster.analyze import AnalysisJob, analyze_on_pool
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.cluster.driver import ShardedRun
    from bertology.cluster.workers import cluster_pool
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.files.run_files import HEADS_FILE, JS_DIVERGENCE_FILE
    from bertology.models.loading import ModelSpec, load_model, require_max_length
    from bertology.progress import stage
    from bertology.report.analysis import save_analysis

    check_output_folder(output)
    checkpoint = checkpoint_file(output, "analyze")
    settings = AnalysisSettings(  # the local run takes them, a Ray run's job carries them to the workers
        max_length=max_len,
        limit=limit,
        batch_size=batch_size,
        corpus_format=corpus_format,
        seed=seed,
        js_tokens_per_segment=js_tokens or None,
        weights=weights,
        convention=convention,
        examples_per_head=examples_per_head,
        cache=not no_cache,
    )
    # the model's loading and the report's writing are stages of their own after the segments' bar
    with progress_bar("", None) as on_stage, stage(on_stage, "Loading the model"):
        loaded = load_model(model, device=device, dtype=dtype)
    require_max_length(loaded, max_len)
    with progress_bar("Analysing segments", limit, rate="segments") as on_progress:
        if cluster is None:
            keep_freed_memory()  # each batch reuses the buffers the last one freed (this process only)
            analysis = analyze_corpus(corpus, loaded, settings, readers=readers, on_progress=on_progress)
        else:
            job = AnalysisJob(ModelSpec(model, device, dtype), settings)
            sharded = ShardedRun(checkpoint, resume, on_progress=on_progress)
            with resumable(checkpoint), cluster_pool(job, cluster) as pool:
                analysis = analyze_on_pool(pool, corpus, loaded, sharded=sharded, readers=readers)
    say_cache_use(analysis.corpus_cache)
    if analysis.truncated_segments:
        err.print(
            f"[yellow]Warning:[/yellow] {analysis.truncated_segments} segments were longer than "
            f"{max_len} tokens; {analysis.tokens_cut} tokens were cut in all.",
            highlight=False,
        )
    with progress_bar("", None) as on_stage, output_folder(output) as folder:
        report = output / save_analysis(analysis, loaded, folder, on_progress=on_stage).name
    checkpoint.unlink(missing_ok=True)  # the run is written; nothing is left to resume
    out.print(
        f"Analysed {analysis.segments} segments in {analysis.seconds:.1f} s. Wrote {report}, "
        f"{output / HEADS_FILE}, {output / JS_DIVERGENCE_FILE} and the plots in {output / 'plots'}.",
        highlight=False,
    )


def require_single_stack_options(model: str, given: dict[str, bool]) -> None:
    """Refuse, in one sentence, an option of the encoder and decoder analysis given for an encoder-decoder.

    Raises:
        BertologyError: the first option in ``given`` (option -> given) that was given.
    """
    from bertology.errors import BertologyError

    for option, was_given in given.items():
        if was_given:
            raise BertologyError(
                f"{option} is for encoder and decoder models; '{model}' is an encoder-decoder model."
            )


def _analyze_encoder_decoder(
    corpus: Path,
    output: Path,
    model: str,
    max_len: int,
    limit: int | None,
    batch_size: int,
    corpus_format: CorpusFormat | None,
    max_new_tokens: int | None,
    device: str,
    dtype: Dtype,
) -> None:
    """``bertology analyze`` of an encoder-decoder: its three kinds of attention (:mod:`bertology.analysis
    .seq2seq`), written by :func:`~bertology.report.seq2seq.save_seq2seq_analysis`."""
    from bertology.allocator import keep_freed_memory
    from bertology.analysis.seq2seq import analyze_seq2seq_corpus
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.files.run_files import HEADS_FILE
    from bertology.models.loading import load_model, require_max_length
    from bertology.progress import stage
    from bertology.report.seq2seq import save_seq2seq_analysis

    check_output_folder(output)
    with progress_bar("", None) as on_stage, stage(on_stage, "Loading the model"):
        loaded = load_model(model, device=device, dtype=dtype)
    require_max_length(loaded, max_len)
    keep_freed_memory()
    with progress_bar("Analysing sources", limit, rate="sources") as on_progress:
        analysis = analyze_seq2seq_corpus(
            corpus,
            loaded,
            max_length=max_len,
            limit=limit,
            batch_size=batch_size,
            corpus_format=corpus_format,
            max_new_tokens=max_new_tokens or MAX_NEW_TOKENS,
            on_progress=on_progress,
        )
    if analysis.truncated_segments:
        err.print(
            f"[yellow]Warning:[/yellow] {analysis.truncated_segments} sources were longer than "
            f"{max_len} tokens; {analysis.tokens_cut} tokens were cut in all.",
            highlight=False,
        )
    with output_folder(output) as folder:
        report = output / save_seq2seq_analysis(analysis, folder).name
    out.print(
        f"Analysed {analysis.segments} sources in {analysis.seconds:.1f} s (encoder, decoder and "
        f"cross-attention). {analysis.decoder_reads()} Wrote {report} and {output / HEADS_FILE}.",
        highlight=False,
    )


def _compare_encoder_decoders(
    model_a: str,
    model_b: str,
    output: Path,
    corpus: Path | None,
    limit: int | None,
    max_len: int,
    batch_size: int,
    device: str,
    dtype: Dtype,
) -> None:
    """``bertology compare`` of two encoder-decoders of one shape: each stack's statistics side by side and
    their changes (:func:`~bertology.analysis.seq2seq.compare_seq2seq_models`)."""
    from bertology.allocator import keep_freed_memory
    from bertology.analysis.seq2seq import compare_seq2seq_models
    from bertology.corpus.segments import sample_corpus
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.loading import load_model, require_max_length
    from bertology.report.seq2seq import COMPARISON_FILE, save_seq2seq_comparison

    check_output_folder(output)
    loaded_a, loaded_b = (load_model(name, device=device, dtype=dtype) for name in (model_a, model_b))
    for loaded in (loaded_a, loaded_b):
        require_max_length(loaded, max_len)
    keep_freed_memory()
    with progress_bar("Comparing sources", None, rate="sources") as on_progress:
        comparison = compare_seq2seq_models(
            loaded_a,
            loaded_b,
            corpus or sample_corpus(),
            max_length=max_len,
            limit=limit,
            batch_size=batch_size,
            on_progress=on_progress,
        )
    with output_folder(output) as folder:
        report = output / save_seq2seq_comparison(comparison, folder).name
    out.print(
        f"Compared {comparison.a.segments} sources (encoder, decoder and cross-attention) in "
        f"{comparison.a.seconds + comparison.b.seconds:.1f} s. Wrote {report} and "
        f"{output / COMPARISON_FILE}.",
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
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Index at most this many segments.")
    ] = None,
    batch_size: SegmentBatchOption = BATCH_SIZE,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    no_cache: NoCacheOption = False,
    readers: ReadersOption = None,
) -> None:
    """Index every token's contextual vector of CORPUS at a few layers, for corpus search in `bertology serve
    --index DIR` (exBERT's idea)."""
    try:  # a usage error before torch loads
        chosen = None if layers is None else [int(layer) for layer in layers.split(",") if layer.strip()]
    except ValueError as error:
        raise typer.BadParameter("--layers takes layer numbers separated by commas, e.g. 1,3,5.") from error
    require_corpus("CORPUS", corpus)
    from bertology.index.store import check_index_folder
    from bertology.index.token_index import build_index
    from bertology.models.loading import load_model, require_max_length

    check_index_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    require_max_length(loaded, max_len)
    with progress_bar("Indexing segments", limit, rate="segments") as on_progress:
        uses: list[CacheUse] = []
        built = build_index(
            corpus,
            output,
            model=loaded,
            layers=chosen,
            batch_size=batch_size,
            max_length=max_len,
            limit=limit,
            on_progress=on_progress,
            cache=not no_cache,
            readers=readers,
            on_cache=uses.append,
        )
    for use in uses:
        say_cache_use(use)
    out.print(
        f"Indexed {len(built)} tokens of {len(built.segments)} segments at layers "
        f"{', '.join(map(str, built.layers))} in {output}.",
        highlight=False,
    )


def ablation_of(
    name: str, side: str, task_dir: Path, max_dev: int, device: str, dtype: Dtype
) -> AblationResult | str:
    """Model ``name``'s single-head ablation on the task, or why it has none (not a fine-tuned classifier)."""
    from bertology.errors import BertologyError
    from bertology.interventions.run import single_head_ablation
    from bertology.models.loading import load_model

    try:
        classifier = load_model(name, classifier=True, device=device, dtype=dtype)
    except BertologyError as error:
        return str(error)
    with progress_bar(f"Ablating the heads of model {side}", None) as on_progress:
        return single_head_ablation(classifier, task_dir, max_dev=max_dev or None, on_progress=on_progress)


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
            "--text", help="Input of the side-by-side views (default: first segment).", callback=utf8_text
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="Compare at most this many segments."),
    ] = None,
    max_dev: Annotated[
        int, typer.Option("--max-dev", min=0, help="Dev examples scored for --task (0: all).")
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
    no_cache: NoCacheOption = False,
    readers: ReadersOption = None,
) -> None:
    """Compare two models head by head: statistics, labels and confidence side by side, heads matched by mean
    JS divergence, both models' head views of one input and, with --task, both ablation pictures."""
    cluster = cluster_options(ray, workers, threads_per_worker, resume)  # a usage error before torch loads
    require_corpus("--corpus", corpus)
    require_task("--task", task_dir)
    from bertology.models.loading import model_kind

    if "encoder-decoder" in (model_kind(model_a), model_kind(model_b)):
        given = {
            "--task": task_dir is not None,
            "--text": text is not None,
            "--js-tokens": js_tokens != JS_TOKENS_PER_SEGMENT,
            "--weights": weights != "attention",
            "--convention": convention != "bertology",
            "--level": level != "auto",
            "--ray / --workers": cluster is not None,
            "--readers": readers is not None,
        }
        require_single_stack_options(model_a if model_kind(model_a) == "encoder-decoder" else model_b, given)
        _compare_encoder_decoders(model_a, model_b, output, corpus, limit, max_len, batch_size, device, dtype)
        return
    from bertology.allocator import keep_freed_memory
    from bertology.analysis.comparison import compare_models, first_segment
    from bertology.analysis.settings import AnalysisSettings
    from bertology.cluster.checkpoint import checkpoint_file
    from bertology.cluster.compare import ComparisonJob, compare_on_pool
    from bertology.cluster.driver import ShardedRun
    from bertology.cluster.workers import cluster_pool
    from bertology.corpus.readers.glue import read_glue
    from bertology.corpus.segments import sample_corpus
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.loading import ModelSpec, load_model, require_max_length
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
    settings = AnalysisSettings(  # the local run takes them, a Ray run's job carries them to the workers
        max_length=max_len,
        limit=limit,
        batch_size=batch_size,
        seed=seed,
        js_tokens_per_segment=js_tokens or None,
        weights=weights,
        convention=convention,
        cache=not no_cache,
    )
    with progress_bar("Comparing segments", limit, rate="segments") as on_progress:
        if cluster is None:
            keep_freed_memory()  # each batch reuses the buffers the last one freed (this process only)
            comparison = compare_models(
                loaded_a, loaded_b, corpus, settings, level=level, readers=readers, on_progress=on_progress
            )
        else:
            specs = (ModelSpec(model_a, device, dtype), ModelSpec(model_b, device, dtype))
            job = ComparisonJob(*specs, settings, level)
            sharded = ShardedRun(checkpoint, resume, on_progress=on_progress)
            with resumable(checkpoint), cluster_pool(job, cluster) as pool:
                comparison = compare_on_pool(
                    pool, corpus, loaded_a, loaded_b, sharded=sharded, readers=readers
                )
    say_cache_use(comparison.a.corpus_cache)
    segment = None if text is not None else first_segment(corpus, loaded_a, loaded_b, max_length=max_len)
    texts = (text, None) if segment is None else (segment.text_a, segment.text_b)
    views = (
        head_view(*texts, model=loaded_a, weights=weights),
        head_view(*texts, model=loaded_b, weights=weights),
    )
    ablations = None
    if task_dir is not None:
        ablations = (
            ablation_of(model_a, "A", task_dir, max_dev, device, dtype),
            ablation_of(model_b, "B", task_dir, max_dev, device, dtype),
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


@app.command()
def heads(
    model: Annotated[
        str,
        typer.Argument(help="'smollm2-135m' (make real-models), 'default', a hub name or a local directory."),
    ],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Folder for report.html, CSV, JSON and plots.")
    ],
    corpus: Annotated[
        Path | None,
        typer.Option("--corpus", help="Corpus of the sink score (default: the sample corpus)."),
    ] = None,
    length: Annotated[
        int, typer.Option("--length", min=1, max=4096, help="Random tokens per half of a repeated sequence.")
    ] = 50,
    sequences: Annotated[int, typer.Option("--sequences", min=1, help="Repeated random sequences.")] = 20,
    segments: Annotated[
        int, typer.Option("--segments", min=1, help="Corpus segments of the sink score.")
    ] = 100,
    max_len: Annotated[int, typer.Option("--max-len", min=2, help="Tokens per corpus segment.")] = 128,
    seed: Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed of the random tokens.")] = 0,
    composition: Annotated[
        bool,
        typer.Option(
            "--composition",
            help="Instead: Q-, K- and V-composition scores of every pair of heads from the weights alone "
            "(Elhage et al. 2021), for encoders and decoders.",
        ),
    ] = False,
    batch_size: SegmentBatchOption = BATCH_SIZE,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Previous-token, duplicate-token and induction heads on repeated random tokens (TransformerLens's
    detectors) and attention sinks over a corpus, for decoder models: scores, labels, heatmaps and views.
    With --composition: how strongly each head's output feeds later heads' queries, keys and values."""
    require_corpus("--corpus", corpus)
    if composition:
        _composition(model, output, device, dtype)
        return
    from bertology.analysis.head_detectors import HEAD_SCORES, detect_heads, repeated_sequence_attention
    from bertology.corpus.segments import sample_corpus
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.heads import head_name
    from bertology.models.loading import load_model, require_max_length
    from bertology.report.head_detectors import SCORES_FILE, write_head_detection

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    require_max_length(loaded, max_len)
    source = corpus or sample_corpus()
    with progress_bar("Scoring heads", sequences + segments, rate="inputs") as on_progress:
        detection = detect_heads(
            loaded,
            source,
            length=length,
            sequences=sequences,
            seed=seed,
            segments=segments,
            max_length=max_len,
            batch_size=batch_size,
            on_progress=on_progress,
        )
    repeated = repeated_sequence_attention(loaded, length=length, seed=seed)
    with output_folder(output) as folder:
        report = output / write_head_detection(detection, repeated, folder).name
    if detection.note:
        err.print(f"Note: {detection.note}.", highlight=False)
    strongest = "; ".join(
        f"{name} {head_name(layer, head)} {score:.3f}"
        for name in HEAD_SCORES
        for layer, head, score in detection.top(name, 1)
    )
    out.print(
        f"Strongest heads (0-based): {strongest}. Wrote {report}, {output / SCORES_FILE} and the plots and "
        f"views in {output}.",
        highlight=False,
    )


def _composition(model: str, output: Path, device: str, dtype: Dtype) -> None:
    """``heads --composition``: :func:`~bertology.analysis.composition.composition_scores` and its files."""
    from bertology.analysis.composition import composition_scores
    from bertology.files.outputs import check_output_folder, output_folder
    from bertology.models.heads import head_name
    from bertology.models.loading import load_model
    from bertology.report.composition import COMPOSITION_FILE, write_composition

    check_output_folder(output)
    loaded = load_model(model, device=device, dtype=dtype)
    scores = composition_scores(loaded)
    with output_folder(output) as folder:
        report = output / write_composition(scores, folder).name
    strongest = "; ".join(
        f"{kind.upper()} {head_name(la, ha)} -> {head_name(lb, hb)} {score:.3f}"
        for kind in scores.scores
        for la, ha, lb, hb, score in scores.top(kind, 1)
    )
    out.print(
        f"Strongest composition (0-based): {strongest or 'none (one layer)'}. Wrote {report}, "
        f"{output / COMPOSITION_FILE} and the JSON and plots beside it.",
        highlight=False,
    )
