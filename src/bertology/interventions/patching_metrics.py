"""The metrics activation, attribution and path patching read from a pair's final logits.

Every metric is a number per pair, ``m``, and every patch's effect is normalised the same way
(:class:`~bertology.interventions.patching.PatchingResult`): denoising ``(m_patched - m_corrupted) /
(m_clean - m_corrupted)``, noising ``(m_patched - m_clean) / (m_clean - m_corrupted)``.

- ``logit-diff`` (the default): ``logit(answer) - logit(wrong)`` at the last token (a classifier: of its two
  labels).
- ``prob-diff``: ``p(answer) - p(wrong)``, the probabilities of the softmax over the vocabulary (or labels).
- ``kl``: ``KL(p_clean || p) = sum_v p_clean(v) (log p_clean(v) - log p(v))``, the divergence of the run's
  next-token distribution (over the vocabulary; a classifier's over its labels) from the clean run's, in
  nats. It is 0 on the clean run, so the normalisation above gives, denoising, ``1 - KL_patched /
  KL_corrupted`` (and, noising, ``-KL_patched / KL_corrupted``): 1 restores the clean distribution, -1
  (noising) moves it as far as the corrupted input does. This normalisation is ours (TransformerLens and
  ARENA's exercises give none for KL). Its gradient at the clean run is 0, so attribution patching's
  noising estimate for it is 0 everywhere.

Answers of several tokens (a language model's ``answer`` or ``wrong``) are scored by the sum of their tokens'
log-probabilities under teacher forcing: the prompt is run with the answer appended
(:class:`~bertology.interventions.patching_pairs.PairGroup`: one row with the answer and one with the wrong
continuation per pair) and ``log p(answer) = sum_i log p(answer_i | prompt, answer_<i)``. ``logit-diff`` is
then ``log p(answer) - log p(wrong)`` (for one token each this is the logit difference, the softmax's
normaliser cancelling), ``prob-diff`` ``p(answer) - p(wrong)`` with ``p = exp(log p)``, and ``kl`` reads
the distribution of the first answer token (the next token after the prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bertology.errors import BertologyError
from bertology.interventions.patching_pairs import PairGroup
from bertology.options import PATCH_METRICS, PatchMetric


def final_logits(logits: torch.Tensor) -> torch.Tensor:
    """[batch, vocabulary] float: a language model's ``logits`` [batch, tokens, vocabulary] at the last token,
    a classifier's [batch, labels] as they are."""
    return (logits[:, -1] if logits.dim() == 3 else logits).float()


def logit_difference(logits: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
    """[batch] ``logit(answer) - logit(wrong)`` of :func:`final_logits`; ``answer``, ``wrong``: [batch]
    token or label ids."""
    last = final_logits(logits)
    return last.gather(1, answer[:, None])[:, 0] - last.gather(1, wrong[:, None])[:, 0]


@dataclass
class Readout:
    """What a metric reads from one pass of a group with ``copies`` copies of its pairs side by side
    (copy ``k``: rows ``k * rows .. (k + 1) * rows - 1`` of the logits, ``rows`` the group's input rows).

    logits: the pass's logits. group: the pairs (their answers). clean: [b, vocabulary] the clean run's
    next-token log-probabilities (``None`` until known; ``kl`` needs them).
    """

    logits: torch.Tensor
    group: PairGroup
    copies: int
    clean: torch.Tensor | None

    def answer_scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([copies * b], [copies * b]) the answer's and the wrong answer's log-probability: of one token
        (or label) at the last position, or of several under teacher forcing (module docstring)."""
        group = self.group
        if group.targets is None:
            log_p = torch.log_softmax(final_logits(self.logits), -1)
            answer, wrong = group.answer.repeat(self.copies), group.wrong.repeat(self.copies)
            return log_p.gather(1, answer[:, None])[:, 0], log_p.gather(1, wrong[:, None])[:, 0]
        targets = group.targets.repeat(self.copies, 1)  # [copies * 2b, L]
        log_p = torch.log_softmax(self.logits[:, -targets.shape[1] :].float(), -1)
        read = log_p.gather(2, targets[..., None])[..., 0] * group.target_mask.repeat(self.copies, 1)
        both = read.sum(1).unflatten(0, (self.copies, 2, -1))  # [copies, answer/wrong, b]
        return both[:, 0].flatten(), both[:, 1].flatten()

    def next_token_log_probs(self) -> torch.Tensor:
        """[copies * b, vocabulary] the log-probabilities of the token after the prompt (a classifier: of
        its labels)."""
        group = self.group
        if group.targets is None:
            return torch.log_softmax(final_logits(self.logits), -1)
        first = self.logits[:, -group.targets.shape[1]].float()  # [copies * 2b, vocabulary]
        answer_rows = first.unflatten(0, (self.copies, 2, -1))[:, 0].flatten(0, 1)
        return torch.log_softmax(answer_rows, -1)


def _logit_difference(readout: Readout) -> torch.Tensor:
    group = readout.group
    if group.targets is None:
        copies = readout.copies
        return logit_difference(readout.logits, group.answer.repeat(copies), group.wrong.repeat(copies))
    answer, wrong = readout.answer_scores()
    return answer - wrong


def _probability_difference(readout: Readout) -> torch.Tensor:
    answer, wrong = readout.answer_scores()
    return answer.exp() - wrong.exp()


def _kl_from_clean(readout: Readout) -> torch.Tensor:
    if readout.clean is None:
        raise RuntimeError("the clean run's distribution is read before any KL divergence from it")
    clean = readout.clean.repeat(readout.copies, 1)
    return (clean.exp() * (clean - readout.next_token_log_probs())).sum(-1)


@dataclass(frozen=True)
class PatchingMetric:
    """One metric: its ``name`` (``--metric``), its ``symbol`` in tables and plots, what it is in words,
    and ``score``: a :class:`Readout` -> [copies * b] the value per pair."""

    name: PatchMetric
    symbol: str
    description: str
    score: Callable[[Readout], torch.Tensor]


METRICS: dict[PatchMetric, PatchingMetric] = {
    metric.name: metric
    for metric in (
        PatchingMetric(
            "logit-diff",
            "LD",
            "the logit difference logit(answer) - logit(wrong) (answers of several tokens: the difference of "
            "their log-probabilities)",
            _logit_difference,
        ),
        PatchingMetric(
            "prob-diff", "PD", "the probability difference p(answer) - p(wrong)", _probability_difference
        ),
        PatchingMetric(
            "kl",
            "KL",
            "the KL divergence KL(p_clean || p) of the next-token distribution from the clean run's, in nats",
            _kl_from_clean,
        ),
    )
}


def patching_metric(name: str) -> PatchingMetric:
    """The metric called ``name``.

    Raises:
        BertologyError: an unknown name.
    """
    if name not in METRICS:
        raise BertologyError(f"Unknown patching metric {name!r}; choose one of {', '.join(PATCH_METRICS)}.")
    return METRICS[name]  # type: ignore[index]


@dataclass
class Scorer:
    """A metric bound to one group of pairs: ``clean`` [b, vocabulary] its clean run's next-token
    log-probabilities, set (:meth:`know_clean`) once the clean run's logits are known."""

    metric: PatchingMetric
    group: PairGroup
    clean: torch.Tensor | None = None

    def know_clean(self, logits: torch.Tensor) -> None:
        """Keep the clean run's next-token log-probabilities from its ``logits`` (detached)."""
        self.clean = Readout(logits.detach(), self.group, 1, None).next_token_log_probs()

    def __call__(self, logits: torch.Tensor, copies: int = 1) -> torch.Tensor:
        """[copies * b] the metric of a pass whose ``logits`` hold ``copies`` copies of the group."""
        return self.metric.score(Readout(logits, self.group, copies, self.clean))
