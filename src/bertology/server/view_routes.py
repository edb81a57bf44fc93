"""The page and the routes of one input: ``GET /``, ``GET /api/health``, ``GET /api/models``,
``POST /api/attention``, ``POST /api/statistics`` and ``POST /api/view`` (:mod:`bertology.server.app`
lists them all).

The quick routes are coroutines that never wait for a worker thread; model work waits for a computation
slot (:mod:`bertology.server.workers`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from bertology.server import compute
from bertology.server.answers import BODY_ERRORS, HTML_ANSWER, error_answers, json_answer
from bertology.server.limits import Limits
from bertology.server.page import VIEW_POLICY, index_html, page_policy
from bertology.server.schemas import (
    AttentionAnswer,
    AttentionRequest,
    Health,
    InputRequest,
    ModelInfo,
    ModelList,
    RequestModels,
    StatisticsAnswer,
    ViewRequest,
    reading_body,
)
from bertology.server.workers import ModelWorkers

_ERRORS = error_answers(
    {
        **BODY_ERRORS,
        422: "A bad request: the message says what is wrong. Besides what the schema excludes, what "
        "depends on the input or the model: more tokens than the server takes per input (max_tokens of "
        "/api/models), a layer or head the chosen model does not have, a span (rows, keys) or query token "
        "beyond the input's tokens, more attention values than one answer carries.",
        503: "The request took longer than the timeout.",
    }
)


def view_routes(workers: ModelWorkers, limits: Limits, bodies: RequestModels) -> APIRouter:
    """The page and the routes of one input, over the loaded models of ``workers`` within ``limits``;
    ``bodies``: the request schemas bounded by the models
    (:func:`~bertology.server.schemas.request_models`)."""
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(index_html(), headers={"Content-Security-Policy": page_policy()})

    @router.get("/api/health", tags=["server"])
    async def health() -> Health:
        return Health(status="ok", models=list(workers.models))

    @router.get("/api/models", tags=["server"])
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
            lambda model: json_answer(
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
            lambda model: json_answer(
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

    router.post("/api/attention", tags=["attention"], response_model=AttentionAnswer, responses=_ERRORS)(
        reading_body(attention, bodies.attention)
    )
    router.post("/api/statistics", tags=["attention"], response_model=StatisticsAnswer, responses=_ERRORS)(
        reading_body(statistics, bodies.input)
    )
    router.post(
        "/api/view", tags=["attention"], response_class=HTMLResponse, responses={**HTML_ANSWER, **_ERRORS}
    )(reading_body(view, bodies.view))
    return router
