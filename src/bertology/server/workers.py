"""Run model work off the event loop: each model loaded once, bounded concurrency, a deadline per request.

A model's weights are shared by all requests. Its fast tokenizer is not: a Hugging Face fast tokenizer
changes its truncation settings on each call and fails when two threads do that at once ("Already
borrowed"), so every computation slot of a model gets its own copy of the tokenizer. Attention capture
records through a ``ContextVar`` (:mod:`bertology.hook`), so concurrent captures never mix.
"""

from __future__ import annotations

import copy
import queue
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio
import anyio.to_thread

from bertology.models import LoadedModel
from bertology.server.errors import RequestError

T = TypeVar("T")


class ModelWorkers:
    """The loaded models, ``parallel`` computation slots each, and the per-request ``timeout_s``.

    models: loaded models, each under its ``name`` (the first is the default).
    """

    def __init__(self, models: Sequence[LoadedModel], *, parallel: int, timeout_s: float) -> None:
        self.models = {loaded.name: loaded for loaded in models}
        self.default = models[0].name
        self.timeout_s = timeout_s
        self._slots: dict[str, queue.Queue[LoadedModel]] = {}
        for name, loaded in self.models.items():
            slots: queue.Queue[LoadedModel] = queue.Queue()
            for _ in range(parallel):
                slots.put(
                    LoadedModel(name=name, model=loaded.model, tokenizer=copy.deepcopy(loaded.tokenizer))
                )
            self._slots[name] = slots

    def model(self, name: str | None) -> LoadedModel:
        """The loaded model called ``name`` (``None``: the default one)."""
        chosen = self.default if name is None else name
        if chosen not in self.models:
            raise RequestError(422, f"Unknown model '{chosen}'; this server has {', '.join(self.models)}.")
        return self.models[chosen]

    def _timed_out(self) -> RequestError:
        return RequestError(
            503,
            f"The request took longer than the server's limit of {self.timeout_s:g} s; "
            "try a shorter input, or again later.",
            headers={"Retry-After": "5"},
        )

    async def run(self, name: str | None, job: Callable[[LoadedModel], T]) -> T:
        """``job(model)`` in a worker thread with a free slot of model ``name``, within the timeout.

        Raises:
            RequestError: 422 for an unknown model; 503 when waiting plus computing passed the timeout
                (a computation already running then finishes in the background, its result dropped).
        """
        slots = self._slots[self.model(name).name]
        deadline = time.monotonic() + self.timeout_s

        def in_slot() -> T:
            try:
                loaded = slots.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise self._timed_out() from None
            try:
                if time.monotonic() >= deadline:  # nobody is waiting for the answer any more
                    raise self._timed_out()
                return job(loaded)
            finally:
                slots.put(loaded)

        try:
            with anyio.fail_after(self.timeout_s):
                return await anyio.to_thread.run_sync(in_slot, abandon_on_cancel=True)
        except TimeoutError:
            raise self._timed_out() from None
