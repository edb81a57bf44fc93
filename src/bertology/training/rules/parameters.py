"""Rule parameters from the command line, as SageMaker Debugger's ``rule_parameters`` give them:
``NAME.PARAM=VALUE`` (``--rule-param LossNotDecreasing.num_steps=20``), applied to the selected rules.

A value is read as its parameter's default is typed: a number (int or float; a parameter without a
default, such as TensorVariance's thresholds, takes a float), ``true``/``false``, or a comma-separated
list for a tuple (``SaturatedActivation.threshold_tanh=-9.5,9.5``; parentheses are allowed). A parameter
whose field lists ``choices`` in its metadata takes one of them, in any case
(``LossNotDecreasing.mode=eval``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from bertology.errors import BertologyError
from bertology.training.rules.watchdog import Rule


def _number(text: str, kind: type, where: str) -> Any:
    try:
        value = kind(text.strip())
    except ValueError:
        raise BertologyError(
            f"{where} takes {'an integer' if kind is int else 'a number'}, not {text!r}."
        ) from None
    if not math.isfinite(value):
        raise BertologyError(f"{where} takes a finite number, not {text!r}.")
    return value


def _value(parameter: dataclasses.Field[Any], text: str, where: str) -> Any:
    """``text`` read as a value of ``parameter`` (module docstring)."""
    default = parameter.default
    choices = parameter.metadata.get("choices")
    if choices is not None:
        chosen = text.strip().upper()
        if chosen not in choices:
            raise BertologyError(f"{where} takes one of {', '.join(choices)}, not {text!r}.")
        return chosen
    if isinstance(default, bool):
        if text.strip().lower() not in ("true", "false"):
            raise BertologyError(f"{where} takes true or false, not {text!r}.")
        return text.strip().lower() == "true"
    if isinstance(default, tuple):
        parts = [part for part in text.strip().strip("()").split(",") if part.strip()]
        kind = type(default[0]) if default else float
        if not parts:
            raise BertologyError(f"{where} takes a comma-separated list, not {text!r}.")
        return tuple(_number(part, kind, where) for part in parts)
    return _number(text, int if isinstance(default, int) else float, where)


def parse_rule_params(params: Sequence[str], rules: dict[str, Rule]) -> dict[str, dict[str, Any]]:
    """``{rule name: {parameter: value}}`` of ``params`` (``NAME.PARAM=VALUE`` each), checked against
    ``rules`` (the selected rules by name).

    Raises:
        BertologyError: a malformed entry, a rule that is not selected, a parameter the rule does not
            have, or a value of the wrong kind.
    """
    parsed: dict[str, dict[str, Any]] = {}
    for entry in params:
        name, dot, rest = entry.partition(".")
        param, equals, text = rest.partition("=")
        name, param = name.strip(), param.strip()
        if not (dot and equals and name and param):
            raise BertologyError(f"--rule-param takes NAME.PARAM=VALUE, not {entry!r}.")
        if name not in rules:
            raise BertologyError(
                f"--rule-param names rule {name}, which the run does not evaluate; its rules: "
                f"{', '.join(rules) or 'none'}."
            )
        fields = {field.name: field for field in dataclasses.fields(rules[name])}  # type: ignore[arg-type]
        if param not in fields:
            raise BertologyError(
                f"Rule {name} has no parameter {param!r}; its parameters: {', '.join(fields)}."
            )
        parsed.setdefault(name, {})[param] = _value(fields[param], text, f"{name}.{param}")
    return parsed


def with_params(rules: Sequence[Rule], params: Sequence[str]) -> list[Rule]:
    """``rules`` with the parameters of ``params`` (:func:`parse_rule_params`) replacing their defaults."""
    parsed = parse_rule_params(params, {rule.name: rule for rule in rules})
    return [dataclasses.replace(rule, **parsed[rule.name]) if rule.name in parsed else rule for rule in rules]  # type: ignore[type-var]
