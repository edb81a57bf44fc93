"""The four kinds of :class:`~bertology.probes.base.ProbeResult`, one per probe, each with the
paragraph its report gives on what is measured: :class:`DependencyResult` (which heads track which
dependency relations), :class:`ParserResult` (the attention-only parser), :class:`CoreferenceResult`
(antecedent selection) and :class:`GapResult` (GAP's scorecard). The verbs of
:mod:`bertology.probes.run` return them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from bertology.errors import BertologyError
from bertology.files.run_files import ANTECEDENTS_FILE, gap_predictions_file
from bertology.probes.base import BestHead, ProbeResult
from bertology.probes.coreference import CorefProbe
from bertology.probes.dependency import ALL, DIRECTIONS, DependencyProbe
from bertology.probes.gap import GapProbe
from bertology.probes.parser import AttentionParser, ParserReport

if TYPE_CHECKING:
    import pandas as pd

    from bertology.attention.words import WordAttention
    from bertology.corpus.readers.treebank import Sentence


class CountsResult(ProbeResult):
    """A result whose scores, tables and JSON are those of its count object ``probe``
    (:class:`~bertology.probes.dependency.DependencyProbe`, :class:`~bertology.probes.coreference.CorefProbe`
    or :class:`~bertology.probes.gap.GapProbe`): ``grid(key)`` is its ``heatmap(key)``."""

    probe: DependencyProbe | CorefProbe | GapProbe

    def grid(self, key: str | None = None) -> np.ndarray:
        return self.probe.heatmap() if key is None else self.probe.heatmap(key)  # type: ignore[call-arg]

    def table(self) -> pd.DataFrame:
        """The probe's headline table (Clark et al.'s Table 1 or 2, GAP's scorecard)."""
        return self.probe.table()

    def to_frame(self) -> pd.DataFrame:
        """Every key and head, in long form."""
        return self.probe.to_frame()

    def to_json(self) -> str:
        """The plain counts every score is computed from."""
        return self.probe.to_json()


@dataclass(repr=False)
class DependencyResult(CountsResult):
    """A dependency probe over one treebank, with a few example sentences kept for the report.

    A head's score for a relation (:meth:`grid`, :meth:`best`) is its accuracy in the relation's best
    direction; the key None is every relation (``"all"``).
    examples: the first ``keep_examples`` sentences with their word attention
        (``probs: [layers, heads, m, m]`` each), for arc diagrams.
    """

    kind: ClassVar[str] = "dependency"
    measure: ClassVar[str] = "accuracy"
    title: ClassVar[str] = "Dependency probe"
    explanation: ClassVar[str] = (
        "Per relation, the single head whose attention argmax most often finds the gold head word (heads "
        "are (layer, head), 0-based), beside the best fixed-offset baseline (offsets -5..+5 from the "
        "dependent; the offset is given)."
    )
    table_file: ClassVar[str] = "table.csv"
    frame_file: ClassVar[str] = "accuracies.csv"

    probe: DependencyProbe
    treebank: str
    model_name: str
    mode: str
    sentences: int
    skipped: int
    seconds: float
    examples: list[tuple[Sentence, WordAttention]] = field(default_factory=list)

    def grid(self, key: str | None = None) -> np.ndarray:
        direction = self.best(key).direction
        assert direction is not None  # the dependency probe's best head always has one
        return self.probe.heatmap(ALL if key is None else key, direction)

    def best(self, key: str | None = None) -> BestHead:
        """The most accurate head and its direction (:meth:`DependencyProbe.best`)."""
        return self.probe.best(ALL if key is None else key)

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "treebank": self.treebank,
            "sentences": self.sentences,
            "skipped (too long, or a word with no token)": self.skipped,
            "word mode": self.mode,
            "seconds": round(self.seconds, 1),
        }


@dataclass(repr=False)
class ParserResult(ProbeResult):
    """Clark et al.'s attention-only parser trained on one treebank and scored on another.

    Keys of :meth:`grid` and :meth:`best`: the columns of :meth:`to_frame` (``"w"``, ``"u"``,
    ``"train_uas_dependent->head"``, ``"train_uas_head->dependent"``); None: every head's training UAS
    in the direction of the best single head. A :class:`BestHead`'s direction is its key's (``w``
    weighs dependent -> head attention, ``u`` head -> dependent attention).
    """

    kind: ClassVar[str] = "parser"
    measure: ClassVar[str] = "UAS"
    title: ClassVar[str] = "Attention-only parser"
    explanation: ClassVar[str] = (
        "UAS without punctuation on the evaluation treebank: the parser "
        "p(i|j) ∝ exp(Σ_k w_k·a_k[j,i] + u_k·a_k[i,j]) over every head k, beside the right-branching "
        "baseline and the single head (chosen on the training set) whose attention argmax finds heads best."
    )
    table_file: ClassVar[str] = "uas.csv"
    frame_file: ClassVar[str] = "parser_weights.csv"
    json_file: ClassVar[str | None] = "parser.json"

    parser: AttentionParser
    report: ParserReport
    train: str
    evaluation: str
    model_name: str
    mode: str
    seconds: float

    def _columns(self) -> dict[str, tuple[int, np.ndarray]]:
        """Each key's direction and ``[layers, heads]`` grid."""
        columns = {"w": (0, self.parser.weights[0]), "u": (1, self.parser.weights[1])}
        for index, direction in enumerate(DIRECTIONS):
            columns[f"train_uas_{direction}"] = (index, self.parser.single_head_train_uas[index])
        return columns

    def _column(self, key: str | None) -> tuple[int, np.ndarray]:
        columns = self._columns()
        if key is None:
            key = f"train_uas_{self.parser.best_single_head[0]}"
        if key not in columns:
            raise BertologyError(f"The parser has no '{key}' per head; use one of: {', '.join(columns)}.")
        return columns[key]

    def grid(self, key: str | None = None) -> np.ndarray:
        return self._column(key)[1].astype(np.float64)

    def best(self, key: str | None = None) -> BestHead:
        direction, grid = self._column(key)
        return BestHead.of_grid(grid.astype(np.float64), direction)

    def table(self) -> pd.DataFrame:
        """UAS of the parser and the baselines (:meth:`ParserReport.to_frame`)."""
        return self.report.to_frame()

    def to_frame(self) -> pd.DataFrame:
        """Every head's weights and training UAS (:meth:`AttentionParser.to_frame`)."""
        return self.parser.to_frame()

    def to_json(self) -> str:
        """The evaluation's scores (:meth:`ParserReport.to_json`)."""
        return self.report.to_json()

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "trained on": f"{self.train} ({self.parser.train_sentences} sentences)",
            "evaluated on": (
                f"{self.evaluation} ({self.report.sentences} sentences, {self.report.words} scored words)"
            ),
            "word mode": self.mode,
            "decoding": self.report.decode,
            "seconds": round(self.seconds, 1),
        }


@dataclass(repr=False)
class CoreferenceResult(CountsResult):
    """Antecedent selection per head over a coreference corpus (:class:`CorefProbe`), with what the run
    read. Keys of :meth:`grid` and :meth:`best`: a mention type (:data:`~bertology.probes.coreference.TYPES`)
    or ``"all"`` (None).

    corpus: the file or folder read. head_words: where the mentions' head words came from. left_out:
    per reason, the CorefUD mentions or entities the reader left out (none for other formats).
    """

    kind: ClassVar[str] = "coreference"
    measure: ClassVar[str] = "accuracy"
    title: ClassVar[str] = "Coreference probe"
    explanation: ClassVar[str] = (
        "A head is right on a coreferent mention when the mention's head word attends most, among the head "
        "words of earlier mentions in the window, to an antecedent's head word (Clark et al. 2019). "
        "Baselines: the nearest earlier mention, the nearest with the same head word, and a rule-based sieve."
    )
    table_file: ClassVar[str] = "table.csv"
    frame_file: ClassVar[str] = "accuracies.csv"

    probe: CorefProbe
    corpus: str
    model_name: str
    head_words: str
    seconds: float
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        """The data files of every probe, and :data:`~bertology.files.run_files.ANTECEDENTS_FILE`: the best
        head's choice for every scored mention (:meth:`CorefProbe.antecedents`)."""
        return [*super().files, ANTECEDENTS_FILE]

    def save(self, folder: str | Path) -> list[Path]:
        paths = super().save(folder)  # the path of every file of :attr:`files`, the antecedents' written here
        self.probe.antecedents().to_csv(Path(folder) / ANTECEDENTS_FILE, index=False)
        return paths

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "coreference corpus": self.corpus,
            "head words from": self.head_words,
            "mentions out of reach (every antecedent before the window)": int(self.probe.out_of_reach.sum()),
            "mentions skipped (sentence longer than the model takes)": int(self.probe.skipped.sum()),
            **{f"left out: {name}": count for name, count in self.left_out.items()},
            "seconds": round(self.seconds, 1),
        }


@dataclass(repr=False)
class GapResult(CountsResult):
    """Every head and GAP's baselines scored with GAP's own scorer (:class:`GapProbe`), with what the run
    read. Keys of :meth:`grid` and :meth:`best`: a gender row of GAP's scores
    (:data:`~bertology.probes.gap_scorer.GENDERS`; None: ``"overall"``); a score is an F1."""

    kind: ClassVar[str] = "gap"
    measure: ClassVar[str] = "F1"
    title: ClassVar[str] = "GAP probe"
    explanation: ClassVar[str] = (
        "Scored as GAP's own scorer does (Webster et al. 2018): every example gives two decisions, whether "
        "name A and whether name B is coreferent with the pronoun, so examples where neither is count too; "
        "precision, recall and F1 overall and by the pronoun's gender, and the bias F1(feminine) / "
        "F1(masculine). A head picks the name its pronoun attends to more (word-level attention); the best "
        "head (0-based layer-head) has the best overall F1. Baselines: the nearest name in words, the "
        "syntactically nearest name and the parallel role (spaCy parses), always A, always B, both, neither."
    )
    table_file: ClassVar[str] = "table.csv"
    frame_file: ClassVar[str] = "heads.csv"
    json_file: ClassVar[str | None] = "gap.json"

    probe: GapProbe
    gap_file: str
    model_name: str
    seconds: float

    @property
    def prediction_files(self) -> dict[str, str]:
        """Each system of :meth:`table` (the best head, then the baselines) and the file of its answers to
        every example, as GAP's own scorer reads system output (:meth:`GapProbe.predictions`,
        :func:`~bertology.files.run_files.gap_predictions_file`); none when the probe kept no answers."""
        if self.probe.answers is None:
            return {}
        return {system: gap_predictions_file(system) for system in self.table()["system"]}

    @property
    def files(self) -> list[str]:
        return [*super().files, *self.prediction_files.values()]

    def save(self, folder: str | Path) -> list[Path]:
        """The data files of every probe, and each system's answers (:attr:`prediction_files`:
        tab-separated, no header, as ``gap_scorer.py --system_tsv`` reads them)."""
        paths = super().save(folder)  # the path of every file of :attr:`files`, the answers' written here
        for system, name in self.prediction_files.items():
            path = Path(folder) / name
            path.parent.mkdir(exist_ok=True)
            self.probe.predictions(system).to_csv(path, sep="\t", header=False, index=False)
        return paths

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "GAP file": self.gap_file,
            "examples": self.probe.examples,
            "examples with exactly one coreferent name (Clark et al.'s accuracy)": self.probe.one_name,
            "examples too long for the model (scored as missing answers)": self.probe.skipped,
            "syntactic baselines": self.probe.syntax_note or "computed from spaCy parses",
            "seconds": round(self.seconds, 1),
        }
