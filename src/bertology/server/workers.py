"""Run model work off the event loop: each model loaded once, bounded concurrency, a deadline per request.

A request first waits for a free computation slot on the event loop (an async semaphore: waiting
holds no thread, so quick routes such as ``/api/health`` never queue behind it), then computes in a
worker thread of the slots' own thread limiter. A request whose client disconnects stops waiting at
once, and one found disconnected when its slot comes is not computed at all. A computation that has
started runs to its end, holding its slot, even when its client is gone or the deadline passes (torch
cannot be interrupted); its result is then dropped.

A model's weights are shared by all requests. Its fast tokenizer is not: a Hugging Face fast tokenizer
changes its truncation settings on each call and fails when two threads do that at once ("Already
borrowed"), so every computation slot of a model gets its own copy of the tokenizer. Attention capture
records through a ``ContextVar`` (:mod:`bertology.models.hook`), so concurrent captures never mix.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request

from bertology.models.loading import LoadedModel
from bertology.server.errors import RequestError, shown

T = TypeVar("T")
R = TypeVar("R")

#: The status of an answer to a client that is gone (nobody reads it; as nginx logs such requests).
CLIENT_GONE = 499


async def _cancel_when_gone(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once the client of ``request`` (whose body was read already) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


class ComputeSlots(Generic[R]):
    """Computation slots, one per resource in ``resources`` (e.g. a model with its own tokenizer copy),
    and the per-request ``timeout_s`` (waiting for a slot included)."""

    def __init__(self, resources: Sequence[R], timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._free = list(resources)
        self._waiting = anyio.Semaphore(len(self._free))
        self._threads = anyio.CapacityLimiter(len(self._free))
        self._running: set[asyncio.Task[Any]] = set()

    def _timed_out(self) -> RequestError:
        return RequestError(
            503,
            f"The request took longer than the server's limit of {self.timeout_s:g} s; "
            "try a shorter input, or again later.",
            headers={"Retry-After": "5"},
        )

    async def run(self, job: Callable[[R], T], request: Request | None = None) -> T:
        """``job(resource)`` in a worker thread with a free slot's resource, within the timeout.

        request: the HTTP request asking for it; when its client disconnects, the request stops waiting.

        Raises:
            RequestError: 503 when waiting plus computing passed the timeout; :data:`CLIENT_GONE` when the
                client disconnected first.
        """
        with anyio.CancelScope() as gone:
            watcher = None if request is None else asyncio.ensure_future(_cancel_when_gone(request, gone))
            try:
                with anyio.fail_after(self.timeout_s):
                    return await self._in_slot(job, request)
            except TimeoutError:
                raise self._timed_out() from None
            finally:
                if watcher is not None:
                    watcher.cancel()
        raise RequestError(CLIENT_GONE, "The client disconnected before its answer was ready.")

    async def _in_slot(self, job: Callable[[R], T], request: Request | None) -> T:
        await self._waiting.acquire()
        try:
            if request is not None and await request.is_disconnected():
                raise RequestError(CLIENT_GONE, "The client disconnected before its computation started.")
            resource = self._free.pop()
        except BaseException:
            self._waiting.release()
            raise
        computation = asyncio.ensure_future(self._compute(job, resource))
        self._running.add(computation)  # a task is only weakly referenced by the event loop
        computation.add_done_callback(self._finished)
        # Shielded: a request that stops waiting leaves the computation to finish and free its slot.
        return await asyncio.shield(computation)

    def _finished(self, computation: asyncio.Task[Any]) -> None:
        self._running.discard(computation)
        if not computation.cancelled():
            computation.exception()  # retrieved: an error nobody waited for is not logged as lost

    async def _compute(self, job: Callable[[R], T], resource: R) -> T:
        try:
            return await anyio.to_thread.run_sync(job, resource, limiter=self._threads)
        finally:
            self._free.append(resource)
            self._waiting.release()


class ModelWorkers:
    """The loaded models, ``parallel`` computation slots each, and the per-request ``timeout_s``.

    models: loaded models, each under its ``name`` (the first is the default).
    """

    def __init__(self, models: Sequence[LoadedModel], *, parallel: int, timeout_s: float) -> None:
        self.models = {loaded.name: loaded for loaded in models}
        self.default = models[0].name
        self._slots = {
            name: ComputeSlots(
                [
                    LoadedModel(name=name, model=loaded.model, tokenizer=copy.deepcopy(loaded.tokenizer))
                    for _ in range(parallel)
                ],
                timeout_s,
            )
            for name, loaded in self.models.items()
        }

    def model(self, name: str | None) -> LoadedModel:
        """The loaded model called ``name`` (``None``: the default one)."""
        chosen = self.default if name is None else name
        if chosen not in self.models:
            raise RequestError(
                422, f"Unknown model '{shown(chosen)}'; this server has {', '.join(self.models)}."
            )
        return self.models[chosen]

    async def run(
        self, name: str | None, job: Callable[[LoadedModel], T], request: Request | None = None
    ) -> T:
        """``job(model)`` in a slot of model ``name`` (see :meth:`ComputeSlots.run`).

        Raises:
            RequestError: 422 for an unknown model, and those of :meth:`ComputeSlots.run`.
        """
        return await self._slots[self.model(name).name].run(job, request)
