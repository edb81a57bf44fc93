"""The explorer's routes: ``GET /explore`` (the page of an analysis folder, ``?run=PATH``) and
``POST /api/explore/analysis``, ``/api/explore/head``, ``/api/explore/example`` (its data;
:mod:`bertology.server.explorer`). They read files, so each runs in a worker thread."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from bertology.server.answers import BODY_ERRORS, HTML_ANSWER, error_answers, json_answer
from bertology.server.errors import RequestError
from bertology.server.explorer import AnalysisRun, AnalysisRuns
from bertology.server.page import VIEW_POLICY, explore_html, page_policy
from bertology.server.schemas import (
    ExploreAnalysis,
    ExploreExampleRequest,
    ExploreHead,
    ExploreHeadRequest,
    ExploreRequest,
)

_ERRORS = error_answers(
    {
        **BODY_ERRORS,
        403: "A path that could reach outside the runs folder.",
        404: "No runs folder, no analysis folder there, or no such example.",
        422: "A bad request, a layer or head beyond the chosen analysis's layers x heads (as "
        "/api/explore/analysis gives them), or a damaged analysis file.",
    }
)


def explorer_routes(analyses: AnalysisRuns | None) -> APIRouter:
    """The explorer's page and data over the analysis folders of the runs folder (``None``: no runs
    folder; the data routes answer 404)."""
    router = APIRouter()

    @router.get("/explore", response_class=HTMLResponse, include_in_schema=False)
    async def explore_page() -> HTMLResponse:
        return HTMLResponse(explore_html(), headers={"Content-Security-Policy": page_policy()})

    def analysis_of(run: str) -> AnalysisRun:
        """The analysis folder ``run`` (read in a worker thread: it reads files)."""
        if analyses is None:
            raise RequestError(404, "This server has no runs folder (start it with --runs DIR).")
        return analyses.get(run)

    @router.post("/api/explore/analysis", tags=["explore"], response_model=ExploreAnalysis, responses=_ERRORS)
    async def explore_analysis(body: ExploreRequest) -> Response:
        """An analysis folder's heads: statistics, labels and map, and the probe and ablation results joined
        in."""
        return await anyio.to_thread.run_sync(
            lambda: json_answer(ExploreAnalysis.model_validate(analysis_of(body.run).overview()))
        )

    @router.post("/api/explore/head", tags=["explore"], response_model=ExploreHead, responses=_ERRORS)
    async def explore_head(body: ExploreHeadRequest) -> Response:
        """One head of an analysis: statistics, label, nearest heads, examples, relations, ablation effect."""
        return await anyio.to_thread.run_sync(
            lambda: json_answer(
                ExploreHead.model_validate(analysis_of(body.run).head_detail(body.layer, body.head))
            )
        )

    @router.post(
        "/api/explore/example",
        tags=["explore"],
        response_class=HTMLResponse,
        responses={**HTML_ANSWER, **_ERRORS},
    )
    async def explore_example(body: ExploreExampleRequest) -> HTMLResponse:
        """The head view of one of a head's stored examples (8-bit attention, as the views carry it)."""
        html = await anyio.to_thread.run_sync(
            lambda: analysis_of(body.run).example_page(body.layer, body.head, body.rank, body.theme)
        )
        return HTMLResponse(html, headers={"Content-Security-Policy": VIEW_POLICY})

    return router
