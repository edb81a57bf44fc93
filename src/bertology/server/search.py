"""Corpus search routes (exBERT's idea): the tokens of a corpus whose contextual vectors are nearest to a
token of the current input, from an index folder that ``bertology index`` wrote
(:mod:`bertology.token_index`).

- ``POST /api/search/info``: whether there is an index, and its model, layers and size;
- ``POST /api/search/input``: the tokens of a typed input and, for one of them, its nearest corpus tokens at
  a layer, each with its context, relation and the token its layer attends to most, and a histogram of the
  neighbours' relations;
- ``POST /api/search/word``: corpus tokens whose word is the given text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Request

from bertology.errors import BertologyError
from bertology.models import LoadedModel
from bertology.server.errors import RequestError
from bertology.server.schemas import (
    SearchAnswer,
    SearchInfo,
    SearchInputRequest,
    SearchWordRequest,
)
from bertology.server.workers import ModelWorkers
from bertology.token_index import TokenIndex, query_vectors, relation_histogram


def _answer(
    index: TokenIndex, rows: list[int], similarities: list[float | None], layer: int
) -> dict[str, Any]:
    described = [
        index.describe(row, layer) | {"similarity": similarity}
        for row, similarity in zip(rows, similarities, strict=True)
    ]
    return {"neighbours": described, "histogram": relation_histogram(described)}


def search_routes(
    folder: str | Path | None, workers: ModelWorkers, max_tokens: int, errors: dict
) -> APIRouter:
    """The search routes over the index ``folder`` (``None``: they answer 404), computing query vectors
    with the loaded model the index was built with.

    Raises:
        BertologyError: ``folder`` is not an index, or its model is not one of the server's.
    """
    index = None if folder is None else TokenIndex.open(folder)
    if index is not None and index.model not in workers.models:
        raise BertologyError(
            f"The index was built with model '{index.model}'; start the server with that model (--model)."
        )
    router = APIRouter(tags=["search"], responses=errors)

    def opened(layer: int | None = None) -> TokenIndex:
        if index is None:
            raise RequestError(404, "This server has no corpus index (start it with --index DIR).")
        if layer is not None and layer not in index.layers:
            raise RequestError(422, f"Layer {layer} is not indexed; the index has layers {index.layers}.")
        return index

    @router.post("/api/search/info")
    async def search_info() -> SearchInfo:
        """The corpus index: its model, layers, tokens and segments (``available`` false: none)."""
        if index is None:
            return SearchInfo(available=False, model=None, layers=[], tokens=0, segments=0)
        return SearchInfo(
            available=True,
            model=index.model,
            layers=index.layers,
            tokens=len(index),
            segments=len(index.segments),
        )

    @router.post("/api/search/input")
    async def search_input(body: SearchInputRequest, request: Request) -> SearchAnswer:
        """The tokens of ``text``; with ``token``, the corpus tokens nearest to it at ``layer``."""
        found = opened(body.layer)

        def job(model: LoadedModel) -> dict[str, Any]:
            tokens, vectors = query_vectors(model, body.text, body.layer, max_tokens)
            if body.token is None:
                return {"tokens": tokens, "neighbours": [], "histogram": []}
            if body.token >= len(tokens):
                raise RequestError(
                    422, f"The input has {len(tokens)} tokens; there is no token {body.token}."
                )
            rows, similarities = found.search(vectors[body.token], body.layer, body.k)
            keep = rows[0] < len(found)  # fewer indexed tokens than k
            return {"tokens": tokens} | _answer(
                found, rows[0][keep].tolist(), similarities[0][keep].round(4).tolist(), body.layer
            )

        return SearchAnswer.model_validate(await workers.run(found.model, job, request))

    @router.post("/api/search/word")
    async def search_word(body: SearchWordRequest) -> SearchAnswer:
        """Corpus tokens whose word is ``word`` (ignoring case), the first ``k`` in corpus order."""
        found = opened(body.layer)

        def job() -> dict[str, Any]:
            rows = found.find_word(body.word, body.k)
            return {"tokens": []} | _answer(found, rows, [None] * len(rows), body.layer)

        return SearchAnswer.model_validate(await anyio.to_thread.run_sync(job))

    return router
