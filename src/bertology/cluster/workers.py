"""Ray workers: a pool of actors that each start a job once (e.g. load a model) and run shards through it.

Ray is imported only here and only when a session or a pool starts, so bertology works without it.
Faults are Ray's to handle: a worker process that dies (killed, out of memory) is restarted by Ray
(``max_restarts``), which starts the job again and re-runs the shards it had not returned
(``max_task_retries``). A shard's result is a value computed from the shard alone and kept once per
shard number, so a shard run twice is still counted once.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar

from bertology.cluster.shards import Shard
from bertology.errors import BertologyError
from bertology.options import ray_address_problem

#: Times Ray restarts a worker that died, and re-runs a shard whose worker died, before the run fails.
MAX_RESTARTS = 4
#: Shards queued on each worker, so that it goes on to the next one without waiting for the driver.
PREFETCH = 2
#: Shards finished ahead of the first unfinished one, per worker, before the driver stops handing out
#: more (bounds the results it holds while waiting for a slow shard).
LOOKAHEAD_PER_WORKER = 8
#: Seconds to wait for a cluster address to answer before saying it cannot be reached.
CONNECT_TIMEOUT = 5.0


class ShardJob(Protocol):
    """A started job on a worker: runs one shard and returns its (picklable) result."""

    def run(self, shard: Shard) -> Any: ...


class JobSpec(Protocol):
    """A picklable recipe sent to every worker; :meth:`start` runs there once (e.g. loads the model)."""

    def start(self) -> ShardJob: ...


SpecT = TypeVar("SpecT", bound=JobSpec)


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how wide a distributed run goes.

    address: ``"local"`` (a Ray cluster on this machine, started for the run and shut down after it), or
        an existing cluster: ``"auto"`` (the one ``ray start`` started on this machine),
        ``"HOST:PORT"`` (its head node, as ``ray start --head`` prints) or ``"ray://HOST:PORT"`` (Ray
        Client). A Ray already initialised in this process is used as it is.
    workers: how many workers (actors), each with its own copy of the model; ``None``: one per GPU of the
        cluster when the workers take GPUs, else as many as its free CPUs hold at ``threads_per_worker``
        each.
    threads_per_worker: torch threads (and Ray CPUs) of each worker.
    gpus_per_worker: GPUs Ray gives each worker (Ray hides the others from it); ``None``: 1 when the job's
        ``device`` is ``cuda...``, or ``auto`` (the default) on a cluster with GPUs, else 0.
    setup: called once in each worker process before its job starts (e.g.
        :func:`bertology.allocator.keep_freed_memory`, a process-wide setting a worker process may make
        because it is the run's own); must be picklable (a module-level function).
    """

    address: str = "local"
    workers: int | None = None
    threads_per_worker: int = 1
    gpus_per_worker: float | None = None
    setup: Callable[[], object] | None = None


def _gpus_per_worker(options: ClusterOptions, spec: object, cluster: dict[str, float]) -> float:
    """:attr:`ClusterOptions.gpus_per_worker`, deciding ``None`` from the device of the job's (first)
    :class:`~bertology.models.loading.ModelSpec`."""
    if options.gpus_per_worker is not None:
        return options.gpus_per_worker
    from bertology.models.loading import ModelSpec  # here: importing this module must not load torch

    models = [value for value in vars(spec).values() if isinstance(value, ModelSpec)]
    device = models[0].device if models else "auto"
    return 1.0 if device.startswith("cuda") or (device == "auto" and cluster.get("GPU", 0) > 0) else 0.0


def import_ray() -> ModuleType:
    """The ``ray`` module.

    Raises:
        BertologyError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as error:
        raise BertologyError(
            "Runs on a Ray cluster need Ray; install it with 'pip install bertology[ray]'."
        ) from error
    return ray


def _host_and_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``HOST:PORT`` or ``ray://HOST:PORT`` address, ``None`` for other forms."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _check_reachable(address: str) -> None:
    """Raise at once when the address's port does not answer (Ray itself would retry for minutes)."""
    target = _host_and_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=CONNECT_TIMEOUT).close()
    except OSError as error:
        raise BertologyError(_unreachable(address, error.strerror or str(error))) from error


def _unreachable(address: str, reason: str) -> str:
    return (
        f"Cannot reach the Ray cluster at {address} ({reason}); start it with 'ray start --head' on its "
        "head node and give the address it prints, or use --ray local."
    )


@contextmanager
def ray_session(options: ClusterOptions) -> Iterator[None]:
    """Ray connected for the block, as ``options.address`` says (see :class:`ClusterOptions`). A local
    cluster gets ``workers * threads_per_worker`` CPUs (all the machine's when ``workers`` is not given)
    and no dashboard, and is shut down after the block; a Ray this process had already started, or an
    existing cluster, is left running.

    Raises:
        BertologyError: an address of no form Ray takes, Ray is not installed, or the cluster cannot be
            reached.
    """
    if problem := ray_address_problem(options.address):
        raise BertologyError(problem)
    ray = import_ray()
    if ray.is_initialized():
        yield
        return
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if options.address == "local":
        cpus = options.workers * options.threads_per_worker if options.workers else os.cpu_count()
        ray.init(num_cpus=cpus, include_dashboard=False, **quiet)
    else:
        _check_reachable(options.address)
        try:
            ray.init(address=options.address, **quiet)
        except ConnectionError as error:
            raise BertologyError(_unreachable(options.address, str(error).split("\n")[0])) from error
    try:
        yield
    finally:
        ray.shutdown()


class ShardWorker:
    """The body of one Ray actor: starts the job once, then runs shards (:class:`WorkerPool` makes it an
    actor).

    A :class:`BertologyError` while starting (e.g. a model folder missing on this node) is kept and
    reported by :meth:`ready` rather than killing the actor, so the driver can say what went wrong.
    """

    def __init__(self, spec: JobSpec, threads: int, setup: Callable[[], object] | None) -> None:
        import torch

        if setup is not None:
            setup()
        torch.set_num_threads(threads)  # this process is the worker's own
        self.job: ShardJob | None = None
        self.error: str | None = None
        try:
            self.job = spec.start()
        except BertologyError as error:
            self.error = str(error)

    def ready(self) -> str | None:
        """``None`` once the job has started, else why it could not."""
        return self.error

    def run(self, shard: Shard) -> Any:
        assert self.job is not None, "run() on a worker whose job did not start"
        return self.job.run(shard)

    def pid(self) -> int:
        """The worker's process id (e.g. to watch or stop it)."""
        return os.getpid()


def _worker_error(error: Exception, what: str) -> BertologyError:
    """A Ray failure as one sentence: a bertology error raised on a worker as it is, a worker that died
    as such; anything else (a bug) is raised again as it came, with the worker's traceback."""
    ray = import_ray()
    cause = getattr(error, "cause", None)
    if isinstance(error, ray.exceptions.RayTaskError) and isinstance(cause, BertologyError):
        return BertologyError(str(cause))
    if isinstance(error, ray.exceptions.RayActorError):
        if what == "starting":
            last = [line for line in str(error).splitlines() if line.strip()][-1].strip()
            return BertologyError(f"A Ray worker could not start its job: {last}")
        return BertologyError(
            f"A Ray worker died while {what} and had been restarted {MAX_RESTARTS} times already (out of "
            "memory? see the Ray logs, /tmp/ray/session_latest/logs on each node)."
        )
    raise error


class WorkerPool(Generic[SpecT]):
    """Ray actors that each run ``spec.start()`` once (:class:`ShardWorker`), then shards through the job.

    Creating the pool starts the workers and waits until every one is ready (:attr:`startup_seconds`), so
    a job that cannot start fails here, before any shard. Use it as a context manager (or call
    :meth:`close`) to stop the workers. Needs a Ray session (:func:`ray_session`).

    Raises:
        BertologyError: Ray is not installed or not connected, or a worker could not start its job.
    """

    def __init__(self, spec: SpecT, options: ClusterOptions) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            raise BertologyError("Start a Ray session first (bertology.cluster.workers.ray_session).")
        start = time.perf_counter()
        self.spec = spec
        threads = options.threads_per_worker
        gpus = _gpus_per_worker(options, spec, ray.cluster_resources())
        free = ray.available_resources()
        fits = free.get("GPU", 0) // gpus if gpus else free.get("CPU", 1) // threads
        count = options.workers or max(1, int(fits))
        actor_class = ray.remote(
            num_cpus=threads,
            num_gpus=gpus,
            max_restarts=MAX_RESTARTS,
            max_task_retries=MAX_RESTARTS,
        )(ShardWorker)
        self.actors = [actor_class.remote(spec, threads, options.setup) for _ in range(count)]
        try:
            errors = ray.get([actor.ready.remote() for actor in self.actors])
        except ray.exceptions.RayError as error:
            self.close()
            raise _worker_error(error, "starting") from error
        if problem := next((error for error in errors if error is not None), None):
            self.close()
            raise BertologyError(problem)
        #: Seconds to start the workers and their jobs (e.g. load the model).
        self.startup_seconds = time.perf_counter() - start

    def __enter__(self) -> WorkerPool[SpecT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (for good: Ray does not restart them)."""
        ray = import_ray()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []

    def map_ordered(self, shards: Iterable[Shard]) -> Iterator[tuple[Shard, Any]]:
        """Run ``shards`` on the workers and yield ``(shard, result)`` in the order of ``shards``.

        Shards are read from ``shards`` only as workers need them (:data:`PREFETCH` queued per worker, at
        most :data:`LOOKAHEAD_PER_WORKER` per worker finished ahead of the first one not yet yielded), so
        a stream of any length runs in bounded memory. A worker that finishes gets the next shard.

        Raises:
            BertologyError: a shard raised one on its worker, or a worker died more than
                :data:`MAX_RESTARTS` times.
        """
        ray = import_ray()
        source = iter(shards)
        lookahead = LOOKAHEAD_PER_WORKER * len(self.actors)
        pending: dict[Any, tuple[int, Shard, int]] = {}  # result ref -> (position, shard, worker)
        queued = [0] * len(self.actors)
        finished: dict[int, tuple[Shard, Any]] = {}
        submitted = yielded = 0
        exhausted = False

        def hand_out() -> None:
            nonlocal submitted, exhausted
            for worker, actor in enumerate(self.actors):
                while not exhausted and queued[worker] < PREFETCH and submitted < yielded + lookahead:
                    shard = next(source, None)
                    if shard is None:
                        exhausted = True
                        return
                    pending[actor.run.remote(shard)] = (submitted, shard, worker)
                    queued[worker] += 1
                    submitted += 1

        hand_out()
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            position, shard, worker = pending.pop(ref)
            queued[worker] -= 1
            try:
                finished[position] = (shard, ray.get(ref))
            except ray.exceptions.RayError as error:
                raise _worker_error(error, f"running {shard.describe()}") from error
            hand_out()
            while yielded in finished:
                yield finished.pop(yielded)
                yielded += 1
            hand_out()


@contextmanager
def cluster_pool(spec: SpecT, options: ClusterOptions) -> Iterator[WorkerPool[SpecT]]:
    """The one way to run a job on a cluster: Ray connected as ``options`` says (:func:`ray_session`) and
    a pool of workers started with ``spec`` (:class:`WorkerPool`), for the block. Every distributed run
    (``analyze_on_pool``, ``compare_on_pool``, the probes' and the ablation's) takes the pool.

    Raises:
        BertologyError: as :func:`ray_session` and :class:`WorkerPool`.
    """
    with ray_session(options), WorkerPool(spec, options) as pool:
        yield pool
