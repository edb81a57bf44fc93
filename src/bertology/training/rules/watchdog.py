"""The watchdog: keeps a run's history, evaluates the rules on every new record and raises each finding
once (per rule and place), so an alert says when a condition first held.

Divergence comes first: the rules that mark a divergence (a ``divergence`` class attribute that is
true, e.g. :class:`~bertology.training.rules.optimisation.ExplodingGradient`) are evaluated before the
others on every record, and once one has fired, every later alert of another rule is raised as
following it (``Alert.follows``): vanishing gradients, saturated activations or collapsed attention after
a divergence are its consequences, not news."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import numpy as np

from bertology.errors import BertologyError
from bertology.training.rules.records import (
    Alert,
    AttentionRecord,
    DevRecord,
    Finding,
    History,
    LossRecord,
    SignalRecord,
    TensorRecord,
)

#: Places listed in an alert's ``what`` before "and N more".
WHAT_PLACES = 3


class Rule(Protocol):
    """A rule: a name and a check of the history that returns what it finds now (module docstrings of
    :mod:`~bertology.training.rules.optimisation` and :mod:`~bertology.training.rules.attention`). A rule
    may also have a ``divergence`` attribute: true marks a rule whose alerts say the run diverged (module
    docstring)."""

    @property
    def name(self) -> str: ...

    def check(self, history: History) -> list[Finding]: ...


def _marks_divergence(rule: Rule) -> bool:
    return bool(getattr(rule, "divergence", False))


def _alert(rule: str, step: int, findings: list[Finding], follows: Alert | None) -> Alert:
    whats = [finding.what for finding in findings[:WHAT_PLACES]]
    more = len(findings) - WHAT_PLACES
    what = "; ".join(whats) + (f"; and {more} more" if more > 0 else "")
    heads = tuple(finding.head for finding in findings if finding.head is not None)
    after = None if follows is None else f"{follows.rule} at step {follows.step}"
    return Alert(rule, step, what, tuple(finding.where for finding in findings), heads, after)


class Watchdog:
    """Evaluates ``rules`` on a run as it is recorded.

    Feed it with :meth:`labels`, :meth:`train`, :meth:`dev`, :meth:`signals`, :meth:`tensors` and
    :meth:`attention`; each returns the alerts raised by that record (a rule's new places, one alert per
    rule). ``alerts`` holds them all; ``stop`` the first alert of a rule named in ``stop_on`` (the run
    should stop), else None. ``clock`` (seconds) stamps each record's arrival in
    ``history.record_times``.

    Raises:
        BertologyError: a name in ``stop_on`` is not one of ``rules``.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        stop_on: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        names = [rule.name for rule in rules]
        unknown = sorted(set(stop_on) - set(names))
        if unknown:
            raise BertologyError(
                f"--stop-on names {', '.join(unknown)}, which the run does not evaluate; its rules: "
                f"{', '.join(names) or 'none'}."
            )
        self.rules = list(rules)
        #: The rules in the order they are evaluated: those that mark a divergence first.
        self._order = sorted(self.rules, key=lambda rule: not _marks_divergence(rule))
        #: The first alert of a rule that marks a divergence, once one fired.
        self.diverged: Alert | None = None
        self.stop_on = frozenset(stop_on)
        self.history = History()
        self.alerts: list[Alert] = []
        self.stop: Alert | None = None
        self.clock = clock
        self._fired: set[tuple[str, str]] = set()

    def labels(self, counts: dict[str, int]) -> list[Alert]:
        """The training labels' counts (``{label: examples}``), known before step 0."""
        self.history.label_counts = dict(counts)
        return self._evaluate(0)

    def train(self, step: int, loss: float) -> list[Alert]:
        self.history.train.append(LossRecord(step, loss))
        return self._evaluate(step)

    def dev(
        self, step: int, loss: float, accuracy: float, confusion: np.ndarray | None = None
    ) -> list[Alert]:
        """A dev evaluation; ``confusion`` [C, C]: examples by true (row) and predicted (column) label."""
        self.history.dev.append(DevRecord(step, loss, accuracy, confusion))
        return self._evaluate(step)

    def signals(self, record: SignalRecord) -> list[Alert]:
        self.history.signals.append(record)
        return self._evaluate(record.step)

    def tensors(self, record: TensorRecord) -> list[Alert]:
        self.history.tensors.append(record)
        return self._evaluate(record.step)

    def attention(self, record: AttentionRecord) -> list[Alert]:
        self.history.attention.append(record)
        return self._evaluate(record.step)

    def _evaluate(self, step: int) -> list[Alert]:
        self.history.record_times.append(self.clock())
        raised = []
        for rule in self._order:
            new = [f for f in rule.check(self.history) if (rule.name, f.where) not in self._fired]
            if not new:
                continue
            self._fired |= {(rule.name, finding.where) for finding in new}
            divergence = _marks_divergence(rule)
            alert = _alert(rule.name, step, new, None if divergence else self.diverged)
            if divergence and self.diverged is None:
                self.diverged = alert
            raised.append(alert)
            if self.stop is None and rule.name in self.stop_on:
                self.stop = alert
        self.alerts += raised
        return raised
