"""GAP pronoun resolution by single heads and by GAP's simple baselines, scored as GAP scores systems.

**Words.** An example's Text is split into words at whitespace; the pronoun is the word covering
``pronoun_offset``, and a name is every word overlapping its character span (the pronoun's word left
out).

**Heads.** With ``W`` the word-level attention of the Text (mean mode, :mod:`bertology.attention.words`), head
``(layer, head)`` answers "A" when ``sum_{w in A} W[p, w] > sum_{w in B} W[p, w]``, "B" when less, and
neither on a tie: it says TRUE for the name it picks and FALSE for the other. Answers are scored with
GAP's own scorer (:mod:`bertology.probes.gap_scorer`): precision, recall and F1 over both names' labels,
overall, masculine and feminine, and the bias F1(F) / F1(M). An example cut to fit the model has no
answer (two false negatives, as GAP's scorer counts a missing output). Clark et al.'s accuracy is kept
beside it: on the examples with exactly one coreferent name, the share where the head picks that name.

**Baselines** (:data:`BASELINES`; Webster et al. 2018, Section 5, choosing between A and B):
``token_distance``: the name with a word nearest the pronoun's word (a tie: the earlier name);
``syntactic_distance``: the name whose head token is nearest the pronoun in spaCy's dependency parse of
the Text (the path in the tree; across sentences, each token's path to its root plus one step per
sentence between them; a tie: token distance decides); ``parallelism``: when the pronoun is a subject
(``nsubj``, ``nsubjpass``) or direct object (``dobj``), the syntactically nearest name with the same role,
else as ``syntactic_distance``; ``always_a``, ``always_b``; ``both`` (both names TRUE) and ``neither``.
A name's head token is its first token whose head lies outside the name. The two syntactic baselines
need spaCy and an English pipeline (``pip install bertology[spacy]``); without them they are left out and
the probe says why (:attr:`GapProbe.syntax_note`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from bertology.corpus.batching import length_sorted_batches
from bertology.corpus.readers.gap import GapExample
from bertology.corpus.readers.spacy_parse import ParsedText, parse_texts
from bertology.errors import BertologyError
from bertology.probes.base import BestHead
from bertology.probes.gap_scorer import GENDERS, GapCounts, decision_counts, pronoun_gender
from bertology.probes.rows import query_word_rows
from bertology.progress import Progress
from bertology.stats.base import check_same_shape

if TYPE_CHECKING:
    import pandas as pd

    from bertology.models.loading import LoadedModel

_WORD = re.compile(r"\S+")
#: Baselines, in table order; the two of :data:`SYNTACTIC` need a spaCy parse.
BASELINES = ("token_distance", "syntactic_distance", "parallelism", "always_a", "always_b", "both", "neither")
SYNTACTIC = ("syntactic_distance", "parallelism")
_ROLES = {"nsubj": "subject", "nsubjpass": "subject", "dobj": "object"}
#: An answer: (A coreferent, B coreferent).
Answer = tuple[bool, bool]
_PICK = {"A": (True, False), "B": (False, True)}


@dataclass(frozen=True)
class GapWords:
    """One example as words: the pronoun's word, the words of names A and B, the gold answer, the
    pronoun's gender (index into GAP's genders after "overall", :mod:`bertology.probes.gap_scorer`) and
    the example's ID."""

    words: list[str]
    pronoun: int
    a: list[int]
    b: list[int]
    gold: Answer
    gender: int
    example_id: str = ""


def _covering(spans: Sequence[tuple[int, int]], start: int, length: int) -> list[int]:
    end = start + max(length, 1)
    return [index for index, (s, e) in enumerate(spans) if s < end and start < e]


def gap_words(example: GapExample) -> GapWords:
    """The example's words (see the module docstring).

    Raises:
        BertologyError: a pronoun GAP does not have (no gender to score).
    """
    gender = pronoun_gender(example.pronoun, f"GAP example {example.id}")
    spans = [match.span() for match in _WORD.finditer(example.text)]
    pronoun = _covering(spans, example.pronoun_offset, len(example.pronoun))[0]
    a = [w for w in _covering(spans, example.a_offset, len(example.a)) if w != pronoun]
    b = [w for w in _covering(spans, example.b_offset, len(example.b)) if w != pronoun]
    words = [example.text[s:e] for s, e in spans]
    return GapWords(words, pronoun, a, b, (example.a_coref, example.b_coref), gender, example.id)


# --- Baselines ------------------------------------------------------------------------------------


def token_distance(item: GapWords) -> str:
    """``"A"`` or ``"B"``: the name with a word nearest the pronoun's (a tie: the earlier name)."""
    a, b = (min(abs(w - item.pronoun) for w in name) for name in (item.a, item.b))
    return "A" if (a, min(item.a)) < (b, min(item.b)) else "B"


def _head_token(parsed: ParsedText, start: int, length: int, pronoun: int) -> int:
    span = [
        t
        for t in _covering(list(zip(parsed.starts, parsed.ends, strict=True)), start, length)
        if t != pronoun
    ]
    outside = [t for t in span if parsed.heads[t] not in span]
    return (outside or span or [pronoun])[0]


def _path_to_root(parsed: ParsedText, token: int) -> list[int]:
    path = [token]
    while parsed.heads[path[-1]] >= 0:
        path.append(parsed.heads[path[-1]])
    return path


def tree_distance(parsed: ParsedText, x: int, y: int) -> int:
    """Edges between tokens ``x`` and ``y`` in the parse (across sentences: see the module docstring)."""
    up_x, up_y = _path_to_root(parsed, x), _path_to_root(parsed, y)
    if parsed.sentences[x] != parsed.sentences[y]:
        return len(up_x) + len(up_y) - 2 + abs(parsed.sentences[x] - parsed.sentences[y])
    depth_x = {token: depth for depth, token in enumerate(up_x)}
    for depth_y, token in enumerate(up_y):
        if token in depth_x:
            return depth_x[token] + depth_y
    raise AssertionError("tokens of one sentence share its root")


def syntactic_choices(example: GapExample, item: GapWords, parsed: ParsedText) -> tuple[str, str]:
    """``("A" | "B", "A" | "B")``: the syntactic-distance and parallelism choices (module docstring)."""
    spans = list(zip(parsed.starts, parsed.ends, strict=True))
    pronoun = _covering(spans, example.pronoun_offset, len(example.pronoun))[0]
    heads = {
        "A": _head_token(parsed, example.a_offset, len(example.a), pronoun),
        "B": _head_token(parsed, example.b_offset, len(example.b), pronoun),
    }
    fallback = token_distance(item)
    distance = {name: tree_distance(parsed, pronoun, token) for name, token in heads.items()}

    def nearest(names: Sequence[str]) -> str:
        return min(names, key=lambda name: (distance[name], name != fallback))

    syntactic = nearest(["A", "B"])
    role = _ROLES.get(parsed.relations[pronoun])
    same_role = [
        name for name, token in heads.items() if role and _ROLES.get(parsed.relations[token]) == role
    ]
    return syntactic, nearest(same_role) if same_role else syntactic


def baseline_answers(item: GapWords, syntactic: tuple[str, str] | None) -> list[Answer]:
    """Each baseline's answer, in :data:`BASELINES` order (the syntactic ones only when given)."""
    answers: dict[str, Answer] = {
        "token_distance": _PICK[token_distance(item)],
        "always_a": (True, False),
        "always_b": (False, True),
        "both": (True, True),
        "neither": (False, False),
    }
    if syntactic is not None:
        answers |= {name: _PICK[choice] for name, choice in zip(SYNTACTIC, syntactic, strict=True)}
    return [answers[name] for name in BASELINES if name in answers]


def syntax_unavailable() -> str | None:
    """Why the syntactic baselines cannot run here (spaCy or its English pipeline missing), or None."""
    try:
        parse_texts(())
    except BertologyError as error:
        return str(error)
    return None


# --- Results --------------------------------------------------------------------------------------

#: The columns of GAP's system output (``constants.SYSTEM_FIELDNAMES`` of its scorer).
PREDICTION_COLUMNS = ("ID", "A-coref", "B-coref")


@dataclass(frozen=True)
class GapAnswers:
    """Every example's answers, in the order scored: ``ids`` [examples]; ``heads`` [examples, 2, layers,
    heads] bool, (A coreferent, B coreferent) of every head; ``answered`` [examples] bool, False for an
    example cut to fit the model (no head answer); ``baselines`` [examples, 2, baselines] bool."""

    ids: list[str]
    heads: np.ndarray
    answered: np.ndarray
    baselines: np.ndarray


@dataclass
class GapProbe:
    """Every head and baseline scored as GAP scores systems (:mod:`bertology.probes.gap_scorer`).

    heads: decision counts ``[2, 4, layers, heads]``; baselines: ``[2, 4, len(baseline_names)]``.
    correct: [layers, heads] int64 examples with exactly one coreferent name each head picks right, of
    ``one_name`` such examples (Clark et al.'s accuracy). examples: examples read; skipped: of them, cut to
    fit the model (no head answer). syntax_note: why the syntactic baselines are missing, or None.
    answers: every example's answers, for :meth:`predictions`.
    """

    heads: GapCounts
    baselines: GapCounts
    baseline_names: tuple[str, ...]
    correct: np.ndarray
    one_name: int
    examples: int
    skipped: int
    syntax_note: str | None = None
    answers: GapAnswers | None = None

    def heatmap(self, gender: str = "overall") -> np.ndarray:
        """[layers, heads] float64 F1 of every head, overall or for one gender (:data:`GENDERS`).

        Raises:
            BertologyError: a row GAP's scores do not have.
        """
        if gender not in GENDERS:
            raise BertologyError(f"GAP has no '{gender}' scores; use one of: {', '.join(GENDERS)}.")
        return self.heads.f1()[GENDERS.index(gender)]

    def accuracy(self) -> np.ndarray:
        """[layers, heads] float64 Clark et al.'s accuracy (see the class docstring; NaN without examples)."""
        return self.correct / self.one_name if self.one_name else np.full(self.correct.shape, np.nan)

    def best(self) -> BestHead:
        """The head with the best overall F1 (ties: the first in layer, head order); ``score``: its F1."""
        return BestHead.of_grid(self.heatmap())

    @staticmethod
    def _scores(counts: GapCounts) -> dict[str, np.ndarray]:
        precision, recall, f1 = counts.precision(), counts.recall(), counts.f1()
        columns = {}
        for row, gender in enumerate(GENDERS):
            columns |= {f"{gender}_p": precision[row], f"{gender}_r": recall[row], f"{gender}_f1": f1[row]}
        return columns | {"bias_f_m": counts.bias()}

    def table(self) -> pd.DataFrame:
        """GAP's scorecard for the best head and every baseline: one row per system; columns system, then
        precision, recall and F1 overall, masculine and feminine (``overall_p`` ...), and ``bias_f_m``."""
        import pandas as pd

        best = self.best()
        heads = {name: values[best.layer, best.head] for name, values in self._scores(self.heads).items()}
        baselines = self._scores(self.baselines)
        rows = [{"system": f"head {best.label}", **heads}]
        rows += [
            {"system": name, **{column: values[i] for column, values in baselines.items()}}
            for i, name in enumerate(self.baseline_names)
        ]
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: layer, head, the scorecard's columns, and Clark et al.'s ``accuracy``."""
        import pandas as pd

        layer, head = np.indices(self.correct.shape).reshape(2, -1)
        scores = {name: values.reshape(-1) for name, values in self._scores(self.heads).items()}
        return pd.DataFrame({"layer": layer, "head": head, **scores, "accuracy": self.accuracy().reshape(-1)})

    def predictions(self, system: str) -> pd.DataFrame:
        """One system's answer to every example it answered, as GAP's scorer reads system output
        (``gap_scorer.py --system_tsv``; written tab-separated without a header, :data:`PREDICTION_COLUMNS`):
        ``ID``, ``A-coref``, ``B-coref``, the last two ``TRUE`` or ``FALSE``. system: a row of
        :meth:`table` (``"head L-H"`` or a baseline's name). An example the head has no answer for (cut to
        fit the model) is left out, which the scorer counts as a missing output, as :meth:`table` does.

        Raises:
            BertologyError: a system the table does not have, or a probe that kept no answers.
        """
        import pandas as pd

        if self.answers is None:
            raise BertologyError("This GAP probe kept no answers per example.")
        best = self.best()
        if system == f"head {best.label}":
            picked, answered = self.answers.heads[:, :, best.layer, best.head], self.answers.answered
        elif system in self.baseline_names:
            picked = self.answers.baselines[:, :, self.baseline_names.index(system)]
            answered = np.ones(len(picked), dtype=bool)
        else:
            systems = [f"head {best.label}", *self.baseline_names]
            raise BertologyError(f"The GAP table has no system '{system}'; it has: {', '.join(systems)}.")
        label = np.array(["FALSE", "TRUE"])
        return pd.DataFrame(
            {
                "ID": np.array(self.answers.ids, dtype=object)[answered],
                "A-coref": label[picked[answered, 0].astype(int)],
                "B-coref": label[picked[answered, 1].astype(int)],
            },
            columns=list(PREDICTION_COLUMNS),
        )

    def to_dict(self) -> dict[str, Any]:
        """The plain counts: ``[gender (masculine, feminine)][tp, fp, fn, tn]`` per head and baseline."""
        return {
            "examples": self.examples,
            "skipped": self.skipped,
            "one_name": self.one_name,
            "correct": self.correct.tolist(),
            "head_counts": self.heads.counts.tolist(),
            "baselines": list(self.baseline_names),
            "baseline_counts": self.baselines.counts.tolist(),
            "syntax_note": self.syntax_note,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


class GapAccumulator:
    """Streams examples, their pronoun rows and baseline answers into a :class:`GapProbe`; mergeable."""

    def __init__(self, baseline_names: Sequence[str] = BASELINES) -> None:
        self.baseline_names = tuple(baseline_names)
        self.heads: np.ndarray | None = None
        self.correct: np.ndarray | None = None
        self.baselines = np.zeros((2, 4, len(self.baseline_names)), dtype=np.int64)
        self.examples = self.skipped = self.one_name = 0
        # every example's answers (GapAnswers): ids, [2, layers, heads] or None, [2, baselines]
        self.ids: list[str] = []
        self.head_answers: list[np.ndarray | None] = []
        self.baseline_answers: list[np.ndarray] = []

    def _grids(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        check_same_shape(None if self.correct is None else self.correct.shape, shape, "GAP probe")
        if self.heads is None or self.correct is None:
            self.heads = np.zeros((2, 4, *shape), dtype=np.int64)
            self.correct = np.zeros(shape, dtype=np.int64)
        return self.heads, self.correct

    def update(self, words: GapWords, row: np.ndarray | None, baselines: Sequence[Answer]) -> None:
        """One example. row: [layers, heads, n_words] word attention from the pronoun to every word of the
        Text, or None when the example did not fit the model (a missing answer). baselines: the answers
        of :attr:`baseline_names`, in order."""
        self.examples += 1
        one_name = words.gold[0] != words.gold[1]
        self.one_name += one_name
        answers = np.array(baselines, dtype=bool).reshape(-1, 2)
        self.baselines[words.gender] += decision_counts(words.gold, answers[:, 0], answers[:, 1])
        self.ids.append(words.example_id)
        self.baseline_answers.append(answers.T)
        if row is None:
            self.skipped += 1
            self.head_answers.append(None)
            if self.heads is not None:
                self.heads[words.gender] += decision_counts(words.gold, None, None)[:, None, None]
            return
        heads, correct = self._grids(row.shape[:2])
        to_a, to_b = row[..., words.a].sum(-1), row[..., words.b].sum(-1)
        heads[words.gender] += decision_counts(words.gold, to_a > to_b, to_b > to_a)
        self.head_answers.append(np.stack([to_a > to_b, to_b > to_a]))
        if one_name:
            correct += (to_a > to_b) if words.gold[0] else (to_b > to_a)

    def merge(self, other: GapAccumulator) -> GapAccumulator:
        if other.baseline_names != self.baseline_names:
            raise BertologyError("Cannot merge GAP probes with different baselines.")
        if other.heads is not None and other.correct is not None:
            heads, correct = self._grids(other.correct.shape)
            heads += other.heads
            correct += other.correct
        self.baselines += other.baselines
        self.examples += other.examples
        self.skipped += other.skipped
        self.one_name += other.one_name
        self.ids += other.ids
        self.head_answers += other.head_answers
        self.baseline_answers += other.baseline_answers
        return self

    def _answers(self, shape: tuple[int, ...]) -> GapAnswers:
        """:class:`GapAnswers` of the examples added (heads ``shape``: [layers, heads])."""
        none = np.zeros((2, *shape), dtype=bool)
        heads = [none if answer is None else answer for answer in self.head_answers]
        return GapAnswers(
            ids=list(self.ids),
            heads=np.stack(heads) if heads else np.zeros((0, 2, *shape), dtype=bool),
            answered=np.array([answer is not None for answer in self.head_answers], dtype=bool),
            baselines=np.stack(self.baseline_answers).astype(bool)
            if self.baseline_answers
            else np.zeros((0, 2, len(self.baseline_names)), dtype=bool),
        )

    def result(self, syntax_note: str | None = None) -> GapProbe:
        if self.heads is None or self.correct is None:
            raise BertologyError("The GAP probe has scored no examples yet; update it first.")
        return GapProbe(
            GapCounts(self.heads.copy()),
            GapCounts(self.baselines.copy()),
            self.baseline_names,
            self.correct.copy(),
            self.one_name,
            self.examples,
            self.skipped,
            syntax_note,
            self._answers(self.correct.shape),
        )


def score_gap(
    examples: Iterable[GapExample],
    model: LoadedModel,
    *,
    limit: int | None = None,
    batch_size: int = 16,
    syntax: bool = True,
    on_progress: Progress | None = None,
) -> GapProbe:
    """Score every head of ``model`` and GAP's baselines on ``examples`` (at most ``limit``).

    Examples are batched by length (:func:`~bertology.corpus.batching.length_sorted_batches`, ``batch_size``
    per forward pass) and only the pronoun's rows are kept (:func:`~bertology.probes.rows.query_word_rows`).
    syntax: run the syntactic baselines when spaCy and its English pipeline are installed.
    on_progress: told the examples scored, with ``limit`` as the total.

    Raises:
        BertologyError: a pronoun GAP does not have, or no example fitted the model.
    """
    note = syntax_unavailable() if syntax else "Syntactic baselines were not asked for."
    names = [name for name in BASELINES if note is None or name not in SYNTACTIC]
    accumulator = GapAccumulator(names)
    missing: list[tuple[GapWords, list[Answer]]] = []  # cut to fit, before any head row set the shape
    items = ((example, gap_words(example)) for example in islice(examples, limit))
    for batch in length_sorted_batches(items, lambda pair: len(pair[0].text), batch_size=batch_size):
        parses: Iterator[ParsedText | None] = (
            parse_texts([example.text for example, _ in batch]) if note is None else iter([None] * len(batch))
        )
        captured = query_word_rows(
            [item.words for _, item in batch], [[item.pronoun] for _, item in batch], model
        )
        for (example, item), rows, parsed in zip(batch, captured, parses, strict=True):
            syntactic = None if parsed is None else syntactic_choices(example, item, parsed)
            answers = baseline_answers(item, syntactic)
            if rows.truncated:
                missing.append((item, answers))
            else:
                accumulator.update(item, rows.rows[:, :, 0], answers)
        if on_progress is not None:
            on_progress(accumulator.examples + len(missing), limit)
    if accumulator.heads is None:
        raise BertologyError(
            f"None of the {len(missing)} GAP examples read fits the model; they are all too long."
        )
    for item, answers in missing:
        accumulator.update(item, None, answers)
    return accumulator.result(note)
