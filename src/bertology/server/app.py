"""The FastAPI application: the page, the JSON API and the runs folder.

Routes (all errors are JSON ``{"error": "..."}``, see :mod:`bertology.server.errors`):

- ``GET /``: the page: type a text or a pair, pick a model, see a view and the per-head statistics.
- ``GET /api/health``, ``GET /api/models``.
- ``POST /api/attention``, ``POST /api/statistics``: JSON for one input.
- ``POST /api/view``: the head, model or neuron view page (HTML) for one input.
- ``GET /api/runs``: the reports and training runs under the runs folder.
- ``GET /explore``: the explorer page of an analysis folder (``?run=PATH``): the map and grid of its heads,
  linked; a head's statistics, nearest heads, top examples as head views, probe and ablation results.
- ``POST /api/explore/analysis``, ``POST /api/explore/head``: its data (:mod:`bertology.server.explorer`);
  ``POST /api/explore/example``: the head view of one of a head's stored examples (HTML).
- ``GET /runs/{path}``: a file of the runs folder; a training run's folder gives its watch page
  (:mod:`bertology.server.watch_pages`).
- ``GET /openapi.json``: the API's OpenAPI schema.

Each area's routes are an ``APIRouter`` of their own module: the page and one input's routes
(:mod:`~bertology.server.view_routes`), the runs folder (:mod:`~bertology.server.run_routes`), the explorer
(:mod:`~bertology.server.explorer_routes`) and corpus search (:mod:`~bertology.server.search`).

Model work waits for a computation slot without holding a thread (:mod:`bertology.server.workers`),
so the quick routes (``/``, ``/api/health``, ``/api/models``, the runs folder's files) answer at once
however many requests queue. With ``hosts`` set, requests with another ``Host`` header get 400
(:mod:`bertology.server.hosts`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bertology.models.loading import LoadedModel, load_model
from bertology.options import DEFAULT_DEVICE, DEFAULT_DTYPE, Dtype
from bertology.server.answers import BODY_ERRORS, error_answers
from bertology.server.errors import install_error_handlers
from bertology.server.explorer import AnalysisRuns
from bertology.server.explorer_routes import explorer_routes
from bertology.server.hosts import HostCheck
from bertology.server.limits import BodySizeLimit, Limits
from bertology.server.page import DEFAULT_POLICY, static_folder
from bertology.server.run_routes import run_routes
from bertology.server.runs import RunsFolder
from bertology.server.schemas import request_models
from bertology.server.search import search_routes
from bertology.server.view_routes import view_routes
from bertology.server.watch_pages import WatchPages
from bertology.server.workers import ComputeSlots, ModelWorkers

_SEARCH_ERRORS = error_answers(
    {
        **BODY_ERRORS,
        404: "No corpus index (start the server with --index DIR).",
        422: "A bad request, or a token beyond the input's tokens (the one part of a request that "
        "depends on the input).",
        503: "The search took longer than the timeout.",
    }
)


class SecurityHeaders:
    """ASGI middleware adding ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and,
    to an answer without a Content-Security-Policy of its own, :data:`DEFAULT_POLICY`."""

    HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))
    POLICY = (b"content-security-policy", DEFAULT_POLICY.encode("ascii"))

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), *self.HEADERS]
                if all(name.lower() != self.POLICY[0] for name, _ in headers):
                    headers.append(self.POLICY)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


def _loaded(models: Sequence[str | LoadedModel], device: str, dtype: Dtype) -> list[LoadedModel]:
    """Each model loaded once (by name or path, on ``device`` in ``dtype``), in order, without repeats."""
    loaded: dict[str, LoadedModel] = {}
    for model in models:
        ready = model if isinstance(model, LoadedModel) else load_model(model, device=device, dtype=dtype)
        loaded.setdefault(ready.name, ready)
    return list(loaded.values())


#: The name prefix of a fine-tuned run's model on the server: ``runs/`` and its path in the runs folder.
RUN_MODEL_PREFIX = "runs/"


def _run_models(folder: RunsFolder | None, device: str, dtype: Dtype) -> list[LoadedModel]:
    """The model of each training run under ``folder`` that saved one (a ``bertology finetune`` run:
    :meth:`RunsFolder.model_runs`), loaded as :func:`load_model` loads a run folder and named
    ``runs/PATH``."""
    if folder is None:
        return []
    return [
        replace(load_model(folder.root / path, device=device, dtype=dtype), name=RUN_MODEL_PREFIX + path)
        for path in folder.model_runs()
    ]


def create_app(
    models: Sequence[str | LoadedModel] = ("default",),
    runs: str | Path | None = None,
    limits: Limits | None = None,
    hosts: Collection[str] | None = None,
    *,
    device: str = DEFAULT_DEVICE,
    dtype: Dtype = DEFAULT_DTYPE,
    index: str | Path | None = None,
) -> FastAPI:
    """The web app for ``models`` (names, paths or loaded models; the first is the default) and the
    runs folder ``runs`` (``None``: no browsing), within ``limits``; ``hosts``: the ``Host`` header
    values it answers (``None``: any; :func:`bertology.server.hosts.loopback_hosts` for a loopback
    server, as ``bertology serve`` sets it); ``index``: a corpus index folder for corpus search
    (:mod:`bertology.server.search`). Models given by name are loaded on ``device`` in ``dtype``
    (:func:`bertology.models.loading.load_model`), and so is each fine-tuned run in the runs folder, after
    them, named ``runs/PATH`` (:func:`_run_models`).

    Raises:
        BertologyError: a model that cannot be loaded, or a runs folder that does not exist.
    """
    limits = limits or Limits()
    folder = None if runs is None else RunsFolder(runs)
    loaded = _loaded(models or ("default",), device, dtype) + _run_models(folder, device, dtype)
    workers = ModelWorkers(loaded, parallel=limits.parallel, timeout_s=limits.timeout_s)
    bodies = request_models(
        [model.name for model in loaded],
        layers=max(model.num_layers for model in loaded),
        heads=max(model.num_heads for model in loaded),
        tokens=min(limits.max_tokens, max(model.max_length for model in loaded)),
    )
    analyses = None if folder is None else AnalysisRuns(folder)
    watch_pages = (
        None
        if folder is None
        else WatchPages(folder, ComputeSlots([None] * limits.parallel, limits.timeout_s))
    )
    app = FastAPI(
        title="bertology",
        summary="Attention of BERT-family models for one input: views, raw attention, per-head statistics.",
        version="1",
        docs_url=None,  # Swagger UI and ReDoc load from a CDN; the page and the views load nothing
        redoc_url=None,
    )
    app.state.models = list(workers.models)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes)
    app.add_middleware(SecurityHeaders)
    if hosts is not None:
        app.add_middleware(HostCheck, hosts=hosts)  # outermost: before anything else reads the request
    app.mount("/static", StaticFiles(directory=static_folder()), name="static")
    app.include_router(view_routes(workers, limits, bodies))
    app.include_router(run_routes(folder, watch_pages))
    app.include_router(explorer_routes(analyses))
    app.include_router(search_routes(index, workers, limits.max_tokens, _SEARCH_ERRORS))
    return app
