"""GAP's own scoring (Webster et al. 2018; ``gap_scorer.py`` of google-research-datasets/gap-coreference).

A system answers, for every example, whether name A and whether name B is coreferent with the pronoun.
Each example gives two decisions, one per name, each scored against the gold label: true positive (gold
and system TRUE), false positive (system TRUE, gold FALSE), false negative (gold TRUE, system FALSE) and
true negative. So every example counts, "neither" examples (both gold labels FALSE) included. An
example without a system answer (here: a text too long for the model) counts as two false negatives,
as GAP's scorer counts a missing output. Precision ``tp / (tp + fp)``, recall ``tp / (tp + fn)`` and
``F1 = 2 P R / (P + R)`` (0 where undefined) are computed overall and per gender of the pronoun
(:data:`PRONOUN_GENDERS`; GAP's pronouns are she/her/hers and he/his/him); the bias is
``F1(feminine) / F1(masculine)`` (NaN when either is 0). Values are fractions (GAP prints percentages).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertology.errors import BertologyError

#: Rows of every score table: overall, then GAP's two genders.
GENDERS = ("overall", "masculine", "feminine")
MASCULINE, FEMININE = 0, 1
#: GAP's ``constants.PRONOUNS``: lowercased pronoun -> gender (index into the genders after "overall").
PRONOUN_GENDERS = {
    **dict.fromkeys(("he", "his", "him"), MASCULINE),
    **dict.fromkeys(("she", "her", "hers"), FEMININE),
}
#: The four decision counts, in the order of :attr:`GapCounts.counts`' second axis.
OUTCOMES = ("tp", "fp", "fn", "tn")
TP, FP, FN, TN = range(4)


def pronoun_gender(pronoun: str, where: str) -> int:
    """The gender of a GAP pronoun (:data:`PRONOUN_GENDERS`).

    Raises:
        BertologyError: a pronoun GAP does not have (naming ``where`` it was found).
    """
    gender = PRONOUN_GENDERS.get(pronoun.lower())
    if gender is None:
        raise BertologyError(
            f"{where}: the pronoun '{pronoun}' is not one of GAP's ({', '.join(PRONOUN_GENDERS)}), so it has "
            "no gender to score."
        )
    return gender


def decision_counts(
    gold: tuple[bool, bool], system_a: np.ndarray | None, system_b: np.ndarray | None
) -> np.ndarray:
    """[4, ...] int64 (:data:`OUTCOMES`) of one example's two decisions.

    gold: (A coreferent, B coreferent). system_a, system_b: bool arrays of any shape (one answer per head,
    or per baseline), or both ``None`` for a missing answer (two false negatives, whatever the gold).
    """
    if system_a is None or system_b is None:
        shape = () if system_a is None else np.shape(system_a)
        counts = np.zeros((4, *shape), dtype=np.int64)
        counts[FN] = 2
        return counts
    counts = np.zeros((4, *np.shape(system_a)), dtype=np.int64)
    for label, answer in zip(gold, (system_a, system_b), strict=True):
        answer = np.asarray(answer, dtype=bool)
        if label:
            counts[TP] += answer
            counts[FN] += ~answer
        else:
            counts[FP] += answer
            counts[TN] += ~answer
    return counts


def _fraction(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    numerator, denominator = np.asarray(numerator, dtype=np.float64), np.asarray(denominator)
    return np.divide(numerator, denominator, out=np.zeros(numerator.shape), where=denominator > 0)


@dataclass(frozen=True)
class GapCounts:
    """Decision counts per gender: ``counts`` [2 genders (masculine, feminine), 4 outcomes, ...] int64,
    the trailing axes one cell per system (``[layers, heads]`` for the heads, ``[baselines]``)."""

    counts: np.ndarray

    def by_gender(self) -> np.ndarray:
        """[3, 4, ...]: overall (the sum of the genders), masculine, feminine (:data:`GENDERS`)."""
        return np.concatenate([self.counts.sum(0, keepdims=True), self.counts])

    def precision(self) -> np.ndarray:
        """[3, ...] float64 ``tp / (tp + fp)`` per gender row (:data:`GENDERS`), 0 where undefined."""
        counts = self.by_gender()
        return _fraction(counts[:, TP], counts[:, TP] + counts[:, FP])

    def recall(self) -> np.ndarray:
        """[3, ...] float64 ``tp / (tp + fn)``, 0 where undefined."""
        counts = self.by_gender()
        return _fraction(counts[:, TP], counts[:, TP] + counts[:, FN])

    def f1(self) -> np.ndarray:
        """[3, ...] float64 ``2 P R / (P + R)``, 0 where undefined."""
        precision, recall = self.precision(), self.recall()
        return _fraction(2 * precision * recall, precision + recall)

    def bias(self) -> np.ndarray:
        """[...] float64 ``F1(feminine) / F1(masculine)``, NaN where either F1 is 0."""
        f1 = self.f1()
        defined = (f1[1] > 0) & (f1[2] > 0)
        return np.divide(f1[2], f1[1], out=np.full(f1.shape[1:], np.nan), where=defined)
