"""Option and argument types shared by the commands, declared once, with the checks that make a bad value
a usage error (exit 2) before anything heavy is imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bertology.options import (
    DEVICE_FORMS,
    MAX_READERS,
    MAX_THREADS,
    Convention,
    Dtype,
    InterpretConvention,
    Weights,
    is_device_name,
    ray_address_problem,
)

if TYPE_CHECKING:
    from bertology.cluster.workers import ClusterOptions


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


def ray_address(address: str | None) -> str | None:
    """``--ray`` as given, or a usage error for an address of no form Ray takes."""
    if address is not None and (problem := ray_address_problem(address)):
        raise typer.BadParameter(problem)
    return address


def number_in(
    low: float, high: float = math.inf, *, above_low: bool = False, below_high: bool = False
) -> Callable[[float], float]:
    """The callback that checks a float option, the one check of every float option's range: the value as
    given, or a usage error that names it when it is not a number (``nan``, which no comparison with a
    bound refuses) or lies outside ``low`` .. ``high`` (``above_low``, ``below_high``: the bound itself
    is outside too; ``high`` infinite and ``below_high``: any finite number)."""
    lower = f"above {low:g}" if above_low else f"from {low:g}"
    upper = "" if math.isinf(high) else f" {'to below' if below_high else 'to'} {high:g}"
    wanted = f"a {'finite ' if math.isinf(high) and below_high else ''}number {lower}{upper}"

    def check(value: float) -> float:
        if math.isnan(value):
            raise typer.BadParameter(f"{value} is not a number; give {wanted}.")
        if value < low or value > high or (above_low and value == low) or (below_high and value == high):
            raise typer.BadParameter(f"{value:g} is not {wanted}.")
        return value

    return check


#: A float option that takes any finite number above 0 (a learning rate, seconds).
positive_finite = number_in(0, above_low=True, below_high=True)
#: A float option that takes a share from 0 to 1.
share = number_in(0, 1)
#: ``--prune``: a share of the heads from 0 up to below 1 (:func:`bertology.interventions.run.run_ablation`
#: keeps at least one).
share_below_one = number_in(0, 1, below_high=True)


RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS|local",
        callback=ray_address,
        help="Run on a Ray cluster (pip install 'bertology\\[ray]'): 'local' (one on this machine), 'auto', "
        "or the HOST:PORT (or ray://HOST:PORT) of a cluster started with 'ray start --head'.",
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
NoCacheOption = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help="Read, segment and encode the corpus again, without reading or writing the encoded-corpus "
        "cache ($BERTOLOGY_CACHE/corpora; see `bertology cache`).",
    ),
]
ReadersOption = Annotated[
    int | None,
    typer.Option(
        "--readers",
        min=1,
        max=MAX_READERS,
        help="Processes that read, segment and encode the corpus when the cache does not serve it (index: "
        "plain text and JSONL; a treebank is indexed sentence by sentence in one) (default: 1 on a CPU, "
        "the cores but one beside a GPU); the results are the same for any number.",
    ),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="With --ray: continue from the checkpoint an interrupted run left in the output folder.",
    ),
]
InterpretConventionOption = Annotated[
    InterpretConvention,
    typer.Option(
        "--convention",
        help="bertology (our definitions) or allennlp (AllenNLP Interpret's: the loss of the prediction, "
        "|scores| summing to 1, its points, samples, beam and ignored tokens).",
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


def utf8_text(text: str | None) -> str | None:
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


def device_name(name: str) -> str:
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
        callback=device_name,
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


TextArgument = Annotated[str, typer.Argument(help="The text (text A of a pair).", callback=utf8_text)]
TextBArgument = Annotated[
    str | None,
    typer.Argument(help="Optional second text (text B of a pair).", callback=utf8_text),
]


def cluster_options(
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


def require_inputs(paths: dict[str, Path | None]) -> None:
    """A usage error, before any model loads, for an input path that does not exist; ``paths``: the
    argument or option as the usage names it (``"CORPUS"``, ``"--task"``) -> its path (``None``: not given).
    A link to nothing, a named pipe or a device is left to the readers, which say what it is.

    Raises:
        typer.BadParameter: the first missing path.
    """
    for hint, path in paths.items():
        if path is not None and not path.exists() and not path.is_symlink():
            raise typer.BadParameter(f"'{path}' does not exist.", param_hint=hint)


def require_task(hint: str, folder: Path | None) -> None:
    """A usage error for a task folder that does not exist (:func:`require_inputs`), then a
    :class:`~bertology.errors.BertologyError` for one without its train or dev file
    (:func:`bertology.corpus.readers.glue.task_files`), both before torch is imported and any model loads."""
    require_inputs({hint: folder})
    if folder is not None:
        from bertology.corpus.readers.glue import task_files

        task_files(folder)


def require_corpus(hint: str, corpus: Path | None, corpus_format: str | None = None) -> None:
    """A usage error for a corpus that does not exist (:func:`require_inputs`), then a
    :class:`~bertology.errors.BertologyError` for a file of no corpus format
    (:func:`bertology.corpus.segments.detect_format`: a table such as a GLUE ``.tsv``), before any model
    loads."""
    require_inputs({hint: corpus})
    if corpus is not None and not corpus.is_dir():
        from bertology.corpus.segments import detect_format

        detect_format(corpus, corpus_format)
