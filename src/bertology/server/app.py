"""The FastAPI application: the page, the JSON API and the runs folder.

Routes (all errors are JSON ``{"error": "..."}``, see :mod:`bertology.server.errors`):

- ``GET /``: the page: type a text or a pair, pick a model, see a view and the per-head statistics.
- ``GET /api/health``, ``GET /api/models``.
- ``POST /api/attention``, ``POST /api/statistics``: JSON for one input.
- ``POST /api/view``: the head, model or neuron view page (HTML) for one input.
- ``GET /api/runs``: the reports and training runs under the runs folder.
- ``GET /runs/{path}``: a file of the runs folder; a training run's folder gives its watch page.
- ``GET /openapi.json``: the API's OpenAPI schema.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bertology.models import LoadedModel, load_model
from bertology.server import compute
from bertology.server.errors import ErrorAnswer, RequestError, install_error_handlers
from bertology.server.limits import BodySizeLimit, Limits
from bertology.server.page import index_html, page_policy, static_folder
from bertology.server.runs import REPORT_FILE, TRAINING_FILE, RunsFolder, folder_url
from bertology.server.schemas import (
    AttentionAnswer,
    AttentionRequest,
    Health,
    InputRequest,
    ModelInfo,
    ModelList,
    RunEntry,
    RunList,
    StatisticsAnswer,
    ViewRequest,
)
from bertology.server.workers import ModelWorkers
from bertology.training.archive import ARCHIVE_FOLDER

#: Served files of the runs folder run sandboxed: their scripts get an opaque origin, so a page found
#: there cannot call this server's API as the page does.
RUN_FILE_POLICY = "sandbox allow-scripts allow-downloads allow-popups; frame-ancestors 'self'"


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
        422: "A bad request: the message says what is wrong.",
        503: "The request took longer than the timeout.",
    }
)


class SecurityHeaders:
    """ASGI middleware adding ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``."""

    HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


def _loaded(models: Sequence[str | LoadedModel]) -> list[LoadedModel]:
    """Each model loaded once (by name or path), in order, without repeats."""
    loaded: dict[str, LoadedModel] = {}
    for model in models:
        ready = model if isinstance(model, LoadedModel) else load_model(model)
        loaded.setdefault(ready.name, ready)
    return list(loaded.values())


def _watch_stamps(run_dir: Path) -> tuple[int, int]:
    """Modification times (ns) of the run's ``run.json`` and its monitor archive's metadata: they change
    whenever training records a step or finishes, so a watch page is rebuilt exactly then."""
    archive = run_dir / ARCHIVE_FOLDER / "zarr.json"
    return (run_dir / TRAINING_FILE).stat().st_mtime_ns, archive.stat().st_mtime_ns if archive.exists() else 0


@functools.lru_cache(maxsize=4)
def _watch_page(run_dir: Path, *stamps: int) -> str:
    """A training run's watch page (building one takes seconds: its plots), cached per ``stamps``."""
    from bertology.training.watch import watch_html

    return watch_html(run_dir)


def create_app(
    models: Sequence[str | LoadedModel] = ("default",),
    runs: str | Path | None = None,
    limits: Limits | None = None,
) -> FastAPI:
    """The web app for ``models`` (names, paths or loaded models; the first is the default) and the
    runs folder ``runs`` (``None``: no browsing), within ``limits``.

    Raises:
        BertologyError: a model that cannot be loaded, or a runs folder that does not exist.
    """
    limits = limits or Limits()
    workers = ModelWorkers(
        _loaded(models or ("default",)), parallel=limits.parallel, timeout_s=limits.timeout_s
    )
    folder = None if runs is None else RunsFolder(runs)
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
    app.mount("/static", StaticFiles(directory=static_folder()), name="static")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(index_html(), headers={"Content-Security-Policy": page_policy()})

    @app.get("/api/health", tags=["server"])
    def health() -> Health:
        return Health(status="ok", models=list(workers.models))

    @app.get("/api/models", tags=["server"])
    def list_models() -> ModelList:
        """The loaded models; ``max_tokens`` is the smaller of the server's and the model's limit."""
        return ModelList(
            default=workers.default,
            models=[
                ModelInfo(
                    name=loaded.name,
                    model_type=loaded.model_type,
                    layers=loaded.num_layers,
                    heads=loaded.num_heads,
                    max_tokens=min(limits.max_tokens, loaded.max_length),
                )
                for loaded in workers.models.values()
            ],
        )

    @app.post("/api/attention", tags=["attention"], responses=_ERRORS)
    async def attention(request: AttentionRequest) -> AttentionAnswer:
        """Attention probabilities of every (or one) layer and head for one text or pair."""
        answer = await workers.run(
            request.model,
            lambda loaded: compute.attention_answer(
                loaded, request, max_tokens=limits.max_tokens, max_values=limits.max_attention_values
            ),
        )
        return AttentionAnswer.model_validate(answer)

    @app.post("/api/statistics", tags=["attention"], responses=_ERRORS)
    async def statistics(request: InputRequest) -> StatisticsAnswer:
        """Per-head surface statistics, pattern scores and labels of one text or pair."""
        answer = await workers.run(
            request.model,
            lambda loaded: compute.statistics_answer(loaded, request, max_tokens=limits.max_tokens),
        )
        return StatisticsAnswer.model_validate(answer)

    @app.post(
        "/api/view",
        tags=["attention"],
        response_class=HTMLResponse,
        responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, **_ERRORS},
    )
    async def view(request: ViewRequest) -> HTMLResponse:
        """The head, model or neuron view of one text or pair, as ``bertology view`` writes it."""
        html = await workers.run(
            request.model, lambda loaded: compute.view_page(loaded, request, max_tokens=limits.max_tokens)
        )
        return HTMLResponse(html)

    @app.get("/api/runs", tags=["runs"])
    def list_runs() -> RunList:
        """Analysis reports, probe reports and training runs under the runs folder."""
        if folder is None:
            return RunList(root=None, runs=[])
        return RunList(
            root=str(folder.root),
            runs=[RunEntry(path=run.path, kind=run.kind, url=run.url) for run in folder.runs()],
        )

    @app.get(
        "/runs/{path:path}",
        tags=["runs"],
        response_class=FileResponse,
        responses={
            200: {"description": "The file, with its own content type.", "content": {"*/*": {}}},
            307: {"description": "A report's folder: to its report.html."},
            **_error_answers(
                {403: "A path that could reach outside the runs folder.", 404: "Nothing there."}
            ),
        },
    )
    def run_file(path: str) -> Response:
        """A file inside the runs folder; a training run's folder gives its watch page (step slider)."""
        if folder is None:
            raise RequestError(404, "This server has no runs folder (start it with --runs DIR).")
        found = folder.resolve(path)
        headers = {"Content-Security-Policy": RUN_FILE_POLICY}
        if found.is_file():
            return FileResponse(found, headers=headers)
        if (found / TRAINING_FILE).is_file():
            return HTMLResponse(_watch_page(found, *_watch_stamps(found)), headers=headers)
        if (found / REPORT_FILE).is_file():
            return RedirectResponse(folder_url(path) + REPORT_FILE)
        raise RequestError(404, f"There is no report or training run at '{path}' in the runs folder.")

    return app
