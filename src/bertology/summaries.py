"""Short console and notebook forms of a result that has a ``summary()``: a one-line ``repr`` and, in a
notebook, the summary as a small table (not every array the result holds, which a dataclass's own ``repr``
would print: 81 kB for a corpus analysis)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

#: Summary fields a ``repr`` shows (the rest are in ``summary()`` and the notebook table).
REPR_FIELDS = 5


class Summarised:
    """Mixin for a result with ``summary() -> {name: value}``; dataclasses using it set ``repr=False``."""

    def summary(self) -> Mapping[str, object]:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = list(self.summary().items())
        shown = ", ".join(f"{name}={value!r}" for name, value in fields[:REPR_FIELDS])
        return f"{type(self).__name__}({shown}{', ...' if len(fields) > REPR_FIELDS else ''})"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{escape(str(name))}</th><td>{escape(str(value))}</td></tr>"
            for name, value in self.summary().items()
        )
        return f"<table><caption>{escape(type(self).__name__)}</caption>{rows}</table>"
