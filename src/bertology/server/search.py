"""Corpus search routes (exBERT's idea): the tokens of a corpus whose contextual vectors are nearest to a
token of the current input, from an index folder that ``bertology index`` wrote
(:mod:`bertology.index.token_index`).

- ``POST /api/search/info``: whether there is an index, and its model, layers and size;
- ``POST /api/search/input``: the tokens of a typed input and, for one of them, its nearest corpus tokens at
  a layer, each with its context, relation, part of speech and the token its layer attends to most
  (special tokens left out), and histograms of the neighbours' relations and parts of speech (exBERT's
  summary);
- ``POST /api/search/word``: corpus tokens whose word is the given text;
- ``POST /api/search/token``: the nearest corpus tokens of a corpus token (e.g. one a word search found).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request

from bertology.errors import BertologyError
from bertology.index.token_index import TokenIndex, histogram, query_vectors
from bertology.models.loading import LoadedModel
from bertology.server.errors import RequestError
from bertology.server.schemas import (
    SearchAnswer,
    SearchInfo,
    SearchInputRequest,
    SearchModels,
    SearchTokenRequest,
    SearchWordRequest,
    reading_body,
    search_request_models,
)
from bertology.server.workers import ModelWorkers


def _neighbours(index: TokenIndex, vector: np.ndarray, layer: int, k: int) -> dict[str, Any]:
    """The answer for the ``k`` corpus tokens nearest to ``vector`` [d] at ``layer``."""
    rows, similarities = index.search(vector, layer, k)
    keep = rows[0] < len(index)  # fewer indexed tokens than k
    return _answer(index, rows[0][keep].tolist(), similarities[0][keep].round(4).tolist(), layer)


def _answer(
    index: TokenIndex, rows: list[int], similarities: list[float | None], layer: int
) -> dict[str, Any]:
    described = [
        index.describe(row, layer) | {"similarity": similarity}
        for row, similarity in zip(rows, similarities, strict=True)
    ]
    return {
        "neighbours": described,
        "histogram": histogram(described, "relation"),
        "pos_histogram": histogram(described, "pos"),
    }


def search_routes(
    folder: str | Path | None, workers: ModelWorkers, max_tokens: int, errors: dict
) -> APIRouter:
    """The search routes over the index ``folder`` (``None``: they answer 404), computing query vectors
    with the loaded model the index was built with; their request schemas name the index's layers, its
    token count and the most tokens an input is read to (``max_tokens``, or the model's own limit).

    The index is opened, and each of its files checked, here: a missing or damaged file refuses the
    server's start with one sentence that names it, rather than failing a search later.

    Raises:
        BertologyError: ``folder`` is not an index, an index file is missing or damaged, or the index's
            model is not one of the server's.
    """
    index = None if folder is None else TokenIndex.open(folder)
    if index is not None and index.model not in workers.models:
        raise BertologyError(
            f"The index was built with model '{index.model}'; start the server with that model (--model)."
        )
    bodies = (
        SearchModels(SearchInputRequest, SearchWordRequest, SearchTokenRequest)
        if index is None
        else search_request_models(
            index.layers,
            rows=len(index),
            tokens=min(max_tokens, workers.models[index.model].max_length),
        )
    )
    router = APIRouter(tags=["search"], responses=errors)

    def opened() -> TokenIndex:
        if index is None:
            raise RequestError(404, "This server has no corpus index (start it with --index DIR).")
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

    async def search_input(body: SearchInputRequest, request: Request) -> SearchAnswer:
        """The tokens of ``text``; with ``token``, the corpus tokens nearest to it at ``layer``."""
        found = opened()

        def job(model: LoadedModel) -> dict[str, Any]:
            tokens, vectors = query_vectors(model, body.text, body.layer, max_tokens)
            if body.token is None:
                return {"tokens": tokens} | _answer(found, [], [], body.layer)
            if body.token >= len(tokens):
                raise RequestError(
                    422, f"The input has {len(tokens)} tokens; there is no token {body.token}."
                )
            return {"tokens": tokens} | _neighbours(found, vectors[body.token], body.layer, body.k)

        return SearchAnswer.model_validate(await workers.run(found.model, job, request))

    async def search_word(body: SearchWordRequest) -> SearchAnswer:
        """Corpus tokens whose word is ``word`` (ignoring case), the first ``k`` in corpus order."""
        found = opened()

        def job() -> dict[str, Any]:
            rows = found.find_word(body.word, body.k)
            return {"tokens": []} | _answer(found, rows, [None] * len(rows), body.layer)

        return SearchAnswer.model_validate(await anyio.to_thread.run_sync(job))

    async def search_token(body: SearchTokenRequest) -> SearchAnswer:
        """The corpus tokens nearest to corpus token ``row`` at ``layer``, by its stored vector (so itself
        among them, at similarity 1)."""
        found = opened()

        def job() -> dict[str, Any]:
            vector = found.vectors(np.array([body.row]), body.layer)[0]
            return {"tokens": []} | _neighbours(found, vector, body.layer, body.k)

        return SearchAnswer.model_validate(await anyio.to_thread.run_sync(job))

    router.post("/api/search/input")(reading_body(search_input, bodies.input))
    router.post("/api/search/word")(reading_body(search_word, bodies.word))
    router.post("/api/search/token")(reading_body(search_token, bodies.token))
    return router
