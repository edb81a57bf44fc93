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

Model work waits for a computation slot without holding a thread (:mod:`bertology.server.workers`),
so the quick routes (``/``, ``/api/health``, ``/api/models``, the runs folder's files) answer at once
however many requests queue. With ``hosts`` set, requests with another ``Host`` header get 400
(:mod:`bertology.server.hosts`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bertology.beneath import OpenFolder
from bertology.models import LoadedModel, load_model
from bertology.options import DEFAULT_DEVICE, DEFAULT_DTYPE, Dtype
from bertology.run_files import REPORT_FILE, TRAINING_FILE
from bertology.server import compute
from bertology.server.errors import ErrorAnswer, RequestError, install_error_handlers, shown
from bertology.server.explorer import AnalysisRun, AnalysisRuns
from bertology.server.hosts import HostCheck
from bertology.server.limits import BodySizeLimit, Limits
from bertology.server.opened_file import OpenedFileResponse
from bertology.server.page import (
    DEFAULT_POLICY,
    RUN_FILE_POLICY,
    VIEW_POLICY,
    explore_html,
    index_html,
    page_policy,
    static_folder,
)
from bertology.server.runs import RunsFolder, folder_url
from bertology.server.schemas import (
    AttentionAnswer,
    AttentionRequest,
    ExploreAnalysis,
    ExploreExampleRequest,
    ExploreHead,
    ExploreHeadRequest,
    ExploreRequest,
    Health,
    InputRequest,
    ModelInfo,
    ModelList,
    RunEntry,
    RunList,
    StatisticsAnswer,
    ViewRequest,
    reading_body,
    request_models,
)
from bertology.server.search import search_routes
from bertology.server.watch_pages import WatchPages
from bertology.server.workers import ComputeSlots, ModelWorkers


def _error_answers(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error statuses: JSON :class:`ErrorAnswer` bodies, whatever the route's own
    content type."""
    schema = ErrorAnswer.model_json_schema()
    return {
        status: {"description": text, "content": {"application/json": {"schema": schema}}}
        for status, text in descriptions.items()
    }


_ERRORS = _error_answers(
    {
        400: "The body could not be read as UTF-8 JSON.",
        413: "The request body is over the limit.",
        422: "A bad request: the message says what is wrong. Besides what the schema excludes, what "
        "depends on the input or the model: more tokens than the server takes per input (max_tokens of "
        "/api/models), a layer or head the chosen model does not have, a span (rows, keys) or query token "
        "beyond the input's tokens, more attention values than one answer carries.",
        503: "The request took longer than the timeout.",
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


def _json(answer: BaseModel) -> Response:
    """``answer`` as a JSON response, serialised where it is called (in the worker thread, so a large
    answer does not hold up the event loop)."""
    return Response(answer.model_dump_json(), media_type="application/json")


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
    (:func:`bertology.models.load_model`).

    Raises:
        BertologyError: a model that cannot be loaded, or a runs folder that does not exist.
    """
    limits = limits or Limits()
    loaded = _loaded(models or ("default",), device, dtype)
    workers = ModelWorkers(loaded, parallel=limits.parallel, timeout_s=limits.timeout_s)
    bodies = request_models(
        [model.name for model in loaded],
        layers=max(model.num_layers for model in loaded),
        heads=max(model.num_heads for model in loaded),
        tokens=min(limits.max_tokens, max(model.max_length for model in loaded)),
    )
    folder = None if runs is None else RunsFolder(runs)
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

    # The quick routes are coroutines: they never wait for a worker thread.
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(index_html(), headers={"Content-Security-Policy": page_policy()})

    @app.get("/api/health", tags=["server"])
    async def health() -> Health:
        return Health(status="ok", models=list(workers.models))

    @app.get("/api/models", tags=["server"])
    async def list_models() -> ModelList:
        """The loaded models; ``max_tokens`` is the smaller of the server's and the model's limit."""
        return ModelList(
            default=workers.default,
            models=[
                ModelInfo(
                    name=model.name,
                    model_type=model.model_type,
                    layers=model.num_layers,
                    heads=model.num_heads,
                    max_tokens=min(limits.max_tokens, model.max_length),
                )
                for model in workers.models.values()
            ],
        )

    async def attention(body: AttentionRequest, request: Request) -> Response:
        """Attention probabilities of every (or one) layer and head for one text or pair."""
        return await workers.run(
            body.model,
            lambda model: _json(
                AttentionAnswer.model_validate(
                    compute.attention_answer(
                        model, body, max_tokens=limits.max_tokens, max_values=limits.max_attention_values
                    )
                )
            ),
            request,
        )

    async def statistics(body: InputRequest, request: Request) -> Response:
        """Per-head surface statistics, pattern scores and labels of one text or pair."""
        return await workers.run(
            body.model,
            lambda model: _json(
                StatisticsAnswer.model_validate(
                    compute.statistics_answer(model, body, max_tokens=limits.max_tokens)
                )
            ),
            request,
        )

    async def view(body: ViewRequest, request: Request) -> HTMLResponse:
        """The head, model or neuron view of one text or pair, as ``bertology view`` writes it."""
        html = await workers.run(
            body.model, lambda model: compute.view_page(model, body, max_tokens=limits.max_tokens), request
        )
        return HTMLResponse(html, headers={"Content-Security-Policy": VIEW_POLICY})

    app.post("/api/attention", tags=["attention"], response_model=AttentionAnswer, responses=_ERRORS)(
        reading_body(attention, bodies.attention)
    )
    app.post("/api/statistics", tags=["attention"], response_model=StatisticsAnswer, responses=_ERRORS)(
        reading_body(statistics, bodies.input)
    )
    app.post(
        "/api/view",
        tags=["attention"],
        response_class=HTMLResponse,
        responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, **_ERRORS},
    )(reading_body(view, bodies.view))

    @app.get("/api/runs", tags=["runs"])
    def list_runs() -> RunList:
        """Analysis reports, probe reports and training runs under the runs folder."""
        if folder is None:
            return RunList(root=None, runs=[])
        return RunList(
            root=str(folder.root),
            runs=[
                RunEntry(path=run.path, kind=run.kind, url=run.url, explore=run.explore_url)
                for run in folder.runs()
            ],
        )

    @app.get("/explore", response_class=HTMLResponse, include_in_schema=False)
    async def explore_page() -> HTMLResponse:
        return HTMLResponse(explore_html(), headers={"Content-Security-Policy": page_policy()})

    explore_errors = _error_answers(
        {
            400: "The body could not be read as UTF-8 JSON.",
            413: "The request body is over the limit.",
            403: "A path that could reach outside the runs folder.",
            404: "No runs folder, no analysis folder there, or no such example.",
            422: "A bad request, a layer or head beyond the chosen analysis's layers x heads (as "
            "/api/explore/analysis gives them), or a damaged analysis file.",
        }
    )

    def analysis_of(run: str) -> AnalysisRun:
        """The analysis folder ``run`` (read in a worker thread: it reads files)."""
        if analyses is None:
            raise RequestError(404, "This server has no runs folder (start it with --runs DIR).")
        return analyses.get(run)

    @app.post(
        "/api/explore/analysis", tags=["explore"], response_model=ExploreAnalysis, responses=explore_errors
    )
    async def explore_analysis(body: ExploreRequest) -> Response:
        """An analysis folder's heads: statistics, labels and map, and the probe and ablation results joined
        in."""
        return await anyio.to_thread.run_sync(
            lambda: _json(ExploreAnalysis.model_validate(analysis_of(body.run).overview()))
        )

    @app.post("/api/explore/head", tags=["explore"], response_model=ExploreHead, responses=explore_errors)
    async def explore_head(body: ExploreHeadRequest) -> Response:
        """One head of an analysis: statistics, label, nearest heads, examples, relations, ablation effect."""
        return await anyio.to_thread.run_sync(
            lambda: _json(
                ExploreHead.model_validate(analysis_of(body.run).head_detail(body.layer, body.head))
            )
        )

    @app.post(
        "/api/explore/example",
        tags=["explore"],
        response_class=HTMLResponse,
        responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, **explore_errors},
    )
    async def explore_example(body: ExploreExampleRequest) -> HTMLResponse:
        """The head view of one of a head's stored examples (8-bit attention, as the views carry it)."""
        html = await anyio.to_thread.run_sync(
            lambda: analysis_of(body.run).example_page(body.layer, body.head, body.rank, body.theme)
        )
        return HTMLResponse(html, headers={"Content-Security-Policy": VIEW_POLICY})

    search_errors = _error_answers(
        {
            400: "The body could not be read as UTF-8 JSON.",
            413: "The request body is over the limit.",
            404: "No corpus index (start the server with --index DIR).",
            422: "A bad request, or a token beyond the input's tokens (the one part of a request that "
            "depends on the input).",
            503: "The search took longer than the timeout.",
        }
    )
    app.include_router(search_routes(index, workers, limits.max_tokens, search_errors))

    @app.get(
        "/runs/{path:path}",
        tags=["runs"],
        response_class=FileResponse,
        responses={
            200: {"description": "The file, with its own content type.", "content": {"*/*": {}}},
            307: {"description": "A report's folder: to its report.html."},
            **_error_answers(
                {
                    403: "A path that could reach outside the runs folder.",
                    404: "Nothing there.",
                    422: "A training run whose files are damaged: the message names the file.",
                    503: "Building a training run's page took longer than the timeout.",
                }
            ),
        },
    )
    async def run_file(path: str, request: Request) -> Response:
        """A file inside the runs folder; a training run's folder gives its watch page (step slider)."""
        if folder is None or watch_pages is None:
            raise RequestError(404, "This server has no runs folder (start it with --runs DIR).")
        opened = folder.open(path)
        headers = {"Content-Security-Policy": RUN_FILE_POLICY}
        if not isinstance(opened, OpenFolder):
            return OpenedFileResponse(opened, headers=headers)
        with opened:  # a run.json that is a link is a training run's, refused when its page reads it
            training, report = opened.stat(TRAINING_FILE) is not None, opened.is_file(REPORT_FILE)
        if training:
            return HTMLResponse(await watch_pages.page(path, request), headers=headers)
        if report:
            return RedirectResponse(folder_url(path) + REPORT_FILE)
        raise RequestError(404, f"There is no report or training run at '{shown(path)}' in the runs folder.")

    return app
