"""GLUE-style classification tasks: a folder with ``train.tsv`` and a dev file, one example per row.

The text columns and the label column are detected from the header, so SST-2 (``sentence``), RTE and
MNLI (``sentence1``/``sentence2``), QNLI (``question``/``sentence``), QQP (``question1``/``question2``)
and MRPC (``#1 String``/``#2 String``) all read without options. Label names come from the training
data (numbers sorted numerically, other names alphabetically), so label ids are stable between runs.
Rows are split on tabs only; GLUE files contain unbalanced quotes, so no quoting is interpreted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertology.corpus.readers import file_problem, read_lines
from bertology.errors import BertologyError

#: Header pairs naming text A and text B, tried in this order; then single-text columns.
PAIR_COLUMNS = (
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("#1 String", "#2 String"),
    ("premise", "hypothesis"),
)
SINGLE_COLUMNS = ("sentence", "text")
LABEL_COLUMNS = ("label", "gold_label", "is_duplicate", "Quality")
DEV_FILES = ("dev.tsv", "dev_matched.tsv", "validation.tsv")


@dataclass(frozen=True)
class Example:
    """One labelled example: ``text_b`` is ``None`` for single-sentence tasks; ``label`` is the raw name."""

    text: str
    text_b: str | None
    label: str


@dataclass(frozen=True)
class Split:
    """The examples of one file, in file order."""

    path: Path
    examples: list[Example]

    @property
    def texts(self) -> list[str]:
        return [example.text for example in self.examples]

    @property
    def texts_b(self) -> list[str] | None:
        """Second texts, or ``None`` for a single-sentence task."""
        if not self.examples or self.examples[0].text_b is None:
            return None
        return [example.text_b or "" for example in self.examples]


@dataclass(frozen=True)
class GlueTask:
    """A classification task read from a folder.

    name: the folder's name (e.g. ``SST-2``); labels: label names, index = label id.
    """

    name: str
    train: Split
    dev: Split
    labels: list[str]

    @property
    def is_pair(self) -> bool:
        return self.train.examples[0].text_b is not None

    def label_ids(self, split: Split) -> list[int]:
        """Label id of each example of ``split``.

        Raises:
            BertologyError: ``split`` has a label that the training data does not have.
        """
        index = {name: number for number, name in enumerate(self.labels)}
        unknown = sorted({example.label for example in split.examples} - index.keys())
        if unknown:
            raise BertologyError(
                f"{split.path} has labels that {self.train.path.name} does not: {', '.join(unknown[:5])}."
            )
        return [index[example.label] for example in split.examples]


def _columns(header: list[str], path: Path) -> tuple[int, int | None, int]:
    """Positions of text A, text B (or ``None``) and the label in ``header``."""
    label = next((header.index(name) for name in LABEL_COLUMNS if name in header), None)
    if label is None:
        raise BertologyError(
            f"{path} has no label column; its header is: {', '.join(header)}. "
            f"Expected one of: {', '.join(LABEL_COLUMNS)}."
        )
    for first, second in PAIR_COLUMNS:
        if first in header and second in header:
            return header.index(first), header.index(second), label
    for name in SINGLE_COLUMNS:
        if name in header:
            return header.index(name), None, label
    raise BertologyError(
        f"{path} has no text column; its header is: {', '.join(header)}. "
        f"Expected 'sentence', 'text', or a pair such as 'sentence1'/'sentence2'."
    )


def read_split(path: Path, limit: int | None = None) -> Split:
    """Read a GLUE-style TSV with a header row; at most ``limit`` examples when given.

    Raises:
        BertologyError: the file cannot be read, has no usable header, or a row has too few columns
            (naming the line).
    """
    lines = read_lines(path)
    first = next(lines, None)
    if first is None or not first[1].strip():
        raise BertologyError(f"{path} is empty; a GLUE-style TSV starts with a header row.")
    header = first[1].split("\t")
    text_a, text_b, label = _columns(header, path)
    needed = max(text_a, label, text_b if text_b is not None else 0) + 1
    examples: list[Example] = []
    for number, line in lines:
        if limit is not None and len(examples) >= limit:
            break
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) < needed:
            raise BertologyError(
                f"{path.name} line {number} has {len(cells)} columns; the header has {len(header)}."
            )
        examples.append(
            Example(
                text=cells[text_a].strip(),
                text_b=cells[text_b].strip() if text_b is not None else None,
                label=cells[label].strip(),
            )
        )
    if not examples:
        raise BertologyError(f"{path} has a header but no examples.")
    return Split(path=path, examples=examples)


def _sorted_labels(names: set[str]) -> list[str]:
    try:
        return sorted(names, key=float)
    except ValueError:
        return sorted(names)


def task_files(folder: str | Path) -> tuple[Path, Path]:
    """The training and dev files of the task folder ``folder`` (``train.tsv``; ``dev.tsv``,
    ``dev_matched.tsv`` or ``validation.tsv``), checked to be there without reading them, so a command
    can refuse a wrong folder before its model loads.

    Raises:
        BertologyError: ``folder`` is not a folder, or has no ``train.tsv`` or no dev file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise BertologyError(f"{folder} is not a folder; a task folder holds train.tsv and dev.tsv.")
    train_path = folder / "train.tsv"
    if problem := file_problem(train_path):
        where = f"{folder} has no train.tsv" if problem == "is missing" else f"{train_path} {problem}"
        raise BertologyError(f"{where}; a task folder holds train.tsv and dev.tsv.")
    dev_path = next((folder / name for name in DEV_FILES if (folder / name).is_file()), None)
    if dev_path is None:
        raise BertologyError(f"{folder} has no dev file (looked for {', '.join(DEV_FILES)}).")
    return train_path, dev_path


def read_glue(folder: str | Path, max_train: int | None = None, max_dev: int | None = None) -> GlueTask:
    """Read ``folder/train.tsv`` and its dev file (``dev.tsv``, ``dev_matched.tsv`` or ``validation.tsv``).

    max_train, max_dev: read only the first this many examples of each split.

    Raises:
        BertologyError: the folder or one of its files is missing or malformed, or the training data
            has fewer than two labels.
    """
    folder = Path(folder)
    train_path, dev_path = task_files(folder)
    train = read_split(train_path, max_train)
    dev = read_split(dev_path, max_dev)
    labels = _sorted_labels({example.label for example in train.examples})
    if len(labels) < 2:
        raise BertologyError(
            f"{train_path} has only the label {labels[0]!r} in the examples read; a classifier needs two "
            "or more (read more examples with a larger --max-train)."
        )
    if (train.examples[0].text_b is None) != (dev.examples[0].text_b is None):
        raise BertologyError(f"{train_path.name} and {dev_path.name} disagree on whether examples are pairs.")
    return GlueTask(name=folder.name, train=train, dev=dev, labels=labels)
